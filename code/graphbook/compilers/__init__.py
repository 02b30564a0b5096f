"""The compilers' side: Inductor's generated code and its logs, the compile cache, AOTInductor, the freezing
miscompile, TVM."""
