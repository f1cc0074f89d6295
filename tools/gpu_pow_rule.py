"""Which rounding eager CUDA uses for half / bfloat16 tensors to constant powers (prints a table)."""
import torch

x = (torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3)
for dt in (torch.bfloat16, torch.float16):
    xd = x.to(dt).cuda()
    for e in (2, 3, -2):
        got = torch.pow(xd, e).cpu()
        once = torch.pow(xd.float(), e).to(dt).cpu()
        steps = {2: (xd * xd), 3: ((xd * xd) * xd), -2: (1.0 / (xd * xd))}[e].cpu()
        print(dt, e, "single rounding" if torch.equal(got, once) else "-",
              "op by op" if torch.equal(got, steps) else "-")
