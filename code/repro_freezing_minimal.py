"""Inductor CPU, freezing=True: a fused kernel reads a buffer before the in-place oneDNN conv + add into it.
Torch only; reduced by code/minimize_freezing.py from code/repro_freezing_miscompile.py. Exit 1 while the
compiled output differs from eager, 0 once fixed."""
import sys, torch
from torch import nn
if __name__ == "__main__" and sys.argv[1:]:  # no options: --help prints the docstring, anything else exits 2
    sys.exit(print('usage: ' + __doc__) if sys.argv[1:] in (['-h'], ['--help']) else print('error: no options', file=sys.stderr) or 2)
torch.set_num_threads(2); torch.manual_seed(0)

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.m0, self.m1 = nn.Conv2d(1, 2, 3, 1, 1, bias=False), nn.Conv2d(2, 4, 1, 1, 0, bias=False)
        self.m2, self.m3 = nn.Conv2d(4, 1, 3, 2, 1, bias=False), nn.Conv2d(1, 1, 1, 1, 0, bias=False)
        self.m4, self.m5 = nn.Upsample(scale_factor=2.0), nn.Conv2d(1, 2, 3, 2, 1, bias=False)
        self.m6, self.m7 = nn.Linear(2, 1, bias=False), nn.Linear(1, 2, bias=False)
        self.m8, self.m9 = nn.Conv2d(2, 1, 1, 1, 0, bias=False), nn.Upsample(scale_factor=2.0)
        self.m10, self.m11 = nn.Conv2d(1, 1, 3, 2, 1, bias=False), nn.Conv2d(1, 2, 3, 2, 1, bias=False)
        self.m12, self.m13 = nn.Conv2d(1, 2, 3, 2, 1, bias=False), nn.Conv2d(2, 4, 3, 2, 1, bias=False)

    def forward(self, x):
        m2 = self.m2(self.m1(self.m0(x)))
        m4 = self.m4(self.m3(m2))
        m5 = self.m5(m2)
        getitem = self.m7(self.m6(m5.mean((2, 3))))[:, :, None, None]
        mul = m5 * getitem
        m9 = self.m9(self.m8(mul))
        m11 = self.m11(self.m10(m4))
        m12 = self.m12(m2)
        m13 = self.m13(((m11 + m12) + mul))
        return m9, m13

model, x = M().eval(), torch.randn(1, 1, 4, 8)
with torch.no_grad():
    expected = model(x)
    with torch._inductor.config.patch(freezing=True):
        actual = torch.compile(model)(x)
diff = max((a - e).abs().max().item() for a, e in zip(actual, expected))
print(f"max abs diff, freezing: {diff:.3g}")
sys.exit(1 if not diff <= 0.0001 else 0)
