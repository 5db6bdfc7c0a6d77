"""Scale searches for the K-quants, vectorized over sub-blocks and candidate scales.

Plain round-to-nearest picks a sub-block's scale from its range alone. These searches (the
idea of llama.cpp's ``make_qkx2_quants`` / ``make_qx_quants``) try a small grid of nearby
inverse scales, re-fit scale (and min) to each candidate's integer codes by weighted least
squares, and keep the candidate with the smallest weighted squared error.

All candidates are evaluated at once as an extra tensor dimension. Only the codes need the
full ``[blocks, candidates, n]`` size; everything else is computed from weighted sums
(``sum w*L``, ``sum w*L*L``, ``sum w*L*x`` ...), the error included, so each candidate costs a
few passes over its codes.
"""
from __future__ import annotations

import torch

F64 = torch.float64


def affine_search(x: torch.Tensor, weights: torch.Tensor, *, nmax: int, rmin: float, rdelta: float,
                  nstep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best ``x ~ scale * L - offset`` with integer L in [0, nmax], per row of x [..., n].

    :param weights: per-element importance [..., n] (the squared error is weighted by it)
    :param rmin, rdelta, nstep: candidate inverse scales are (nmax + rmin + rdelta * i) / range, i in [0, nstep],
        besides the plain nmax / range (which keeps its range-based scale and min, un-refitted)
    :returns: ``(scale, offset)`` each [...]; offset >= 0 (the block minimum is never above 0)
    """
    low = x.amin(-1).clamp(max=0)
    spread = x.amax(-1) - low
    factors = torch.tensor([float(nmax)] + [nmax + rmin + rdelta * i for i in range(nstep + 1)], device=x.device)
    inverse = factors / torch.where(spread > 0, spread, torch.ones_like(spread)).unsqueeze(-1)      # [..., C]
    codes = (inverse.unsqueeze(-1) * (x - low.unsqueeze(-1)).unsqueeze(-2)).round_().clamp_(0, nmax)  # [..., C, n]
    sums = _weighted_sums(codes, x, weights)
    scale, minimum = _fit_affine(sums)
    scale[..., 0], minimum[..., 0] = 1 / inverse[..., 0], low      # candidate 0: the range-based choice
    error = _affine_error(sums, scale, minimum)
    best = error.argmin(-1, keepdim=True)
    scale, minimum = scale.gather(-1, best).squeeze(-1), minimum.gather(-1, best).squeeze(-1)
    flat = spread == 0  # a constant sub-block: all codes 0, the offset carries the value
    return (torch.where(flat, torch.zeros_like(scale), scale).to(x.dtype),
            torch.where(flat, -low.double(), -minimum).to(x.dtype))


def _weighted_sums(codes: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sums every candidate's fit and error need; per-candidate ones are [..., C], the rest [..., 1].
    Elementwise products and sums, not matmuls (which TF32 may round on GPUs). The float32 products
    are summed in float64, where a sum of 32 of them is exact in any order: the compiled quantizer
    (quant_cpu.cpp) then gets the same sums, and picks the same candidates."""
    weighted = codes * w.unsqueeze(-2)
    return {"w": w.sum(-1, keepdim=True, dtype=F64), "x": (w * x).sum(-1, keepdim=True, dtype=F64),
            "xx": (w * x * x).sum(-1, keepdim=True, dtype=F64), "l": weighted.sum(-1, dtype=F64),
            "ll": (weighted * codes).sum(-1, dtype=F64), "lx": (weighted * x.unsqueeze(-2)).sum(-1, dtype=F64)}


def _fit_affine(s: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted least squares of ``x ~ scale * L + minimum`` with minimum <= 0 (inf where singular)."""
    det = s["w"] * s["ll"] - s["l"] * s["l"]
    ok = det > 0
    safe_det = torch.where(ok, det, torch.ones_like(det))
    scale = (s["w"] * s["lx"] - s["x"] * s["l"]) / safe_det
    minimum = (s["ll"] * s["x"] - s["l"] * s["lx"]) / safe_det
    positive = minimum > 0  # a block min above zero is not representable: fit the scale alone
    scale = torch.where(positive, s["lx"] / torch.where(s["ll"] > 0, s["ll"], torch.ones_like(s["ll"])), scale)
    minimum = torch.where(positive, torch.zeros_like(minimum), minimum)
    inf = torch.full_like(scale, float("inf"))
    return torch.where(ok, scale, inf), torch.where(ok, minimum, inf)


def _affine_error(s: dict[str, torch.Tensor], scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """sum w * (scale * L + minimum - x)**2, expanded into the weighted sums (inf for unusable fits)."""
    error = (scale * scale * s["ll"] + 2 * scale * minimum * s["l"] + minimum * minimum * s["w"]
             - 2 * scale * s["lx"] - 2 * minimum * s["x"] + s["xx"])
    usable = torch.isfinite(scale) & torch.isfinite(minimum)
    return torch.where(usable, error, torch.full_like(error, float("inf")))


def symmetric_search(x: torch.Tensor, *, nmax: int, steps: int = 9, step: float = 0.1) -> torch.Tensor:
    """Best ``x ~ scale * L`` with integer L in [-nmax, nmax - 1], weights x**2, per row of x [..., n].

    The scale is signed: it maps the element of largest magnitude to -nmax (the side the
    asymmetric code range can reach). Candidates: inverse scales -(nmax + step * i) / max, |i| <= steps.
    With the best scale for given codes, the weighted error drops by (sum w*L*x)**2 / sum w*L*L,
    so the candidate maximizing that ratio wins.
    """
    peak = x.gather(-1, x.abs().argmax(-1, keepdim=True))                                      # [..., 1]
    offsets = torch.tensor([0.0] + [step * i for i in range(-steps, steps + 1) if i], device=x.device)
    inverse = -(nmax + offsets) / torch.where(peak == 0, torch.ones_like(peak), peak)          # [..., C]
    codes = (inverse.unsqueeze(-1) * x.unsqueeze(-2)).round_().clamp_(-nmax, nmax - 1)       # [..., C, n]
    w = x * x
    sum_lx = (codes * (w * x).unsqueeze(-2)).sum(-1, dtype=F64)  # float64 sums: see _weighted_sums
    sum_l2 = (codes * codes * w.unsqueeze(-2)).sum(-1, dtype=F64)
    usable = sum_l2 > 0
    safe_l2 = torch.where(usable, sum_l2, torch.ones_like(sum_l2))
    merit = torch.where(usable, sum_lx * sum_lx / safe_l2, torch.full_like(sum_l2, -1.0))
    best = merit.argmax(-1, keepdim=True)
    scale = (sum_lx.gather(-1, best) / safe_l2.gather(-1, best)).squeeze(-1)
    return torch.where(peak.squeeze(-1).abs() < 1e-15, torch.zeros_like(scale), scale).to(x.dtype)
