"""The compilers' side: Inductor's generated code, its logs, switches and ablations; TVM's untuned build."""
