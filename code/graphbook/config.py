"""The book's shared settings, each with one home, so changing one changes the whole book."""

#: What the server batches, and the sizes every dynamic-batch export is checked at.
BATCH_SIZES = (1, 2, 3)

#: The article's input (height, width); the CPU and GPU matrices decide only at this size.
FULL_SIZE = (288, 512)
#: A third of each side: the size a laptop re-runs in minutes.
SMALL_SIZE = (96, 160)

#: The book's thread count: two cores, what a laptop gives a notebook and what the book's machines have.
THREADS = 2

#: The one tolerance for "same output as eager FP32" (Chapters 3-7): the largest absolute difference of the logits,
#: relative to the reference's magnitude above 1; reordered FP32 sums stay far below it, a miscompile does not.
SAME_OUTPUT_ATOL = 1e-3
#: Conv + BatchNorm folded into one convolution against conv then BN, relative to the output's magnitude
#: (Chapters 1-2): folding re-associates a few float32 products per output, which stays far below it.
FOLD_RTOL = 1e-5
#: A fused chain of elementwise operators against eager, elementwise (Chapter 2): float32 rounding and nothing more.
FLOAT32_ROUNDING = 1e-6
#: What the freezing reproducers call a wrong output: a difference from eager above this (appendix), a number the
#: standalone reproducers in code/ repeat, since they import nothing of the book's.
MISCOMPILE_ATOL = 1e-4
