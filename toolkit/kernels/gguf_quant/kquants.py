"""The K-quant super-block types Q4_K, Q5_K and Q6_K (256 elements per block).

Layouts (as gguf-py's dequantizers read them):

* Q4_K, 144 bytes: d, dmin (fp16) | 12 bytes of eight 6-bit scales and eight 6-bit mins |
  128 bytes of 4-bit codes. Element value = d * scale_j * q - dmin * min_j, sub-blocks of 32.
* Q5_K, 176 bytes: as Q4_K, plus 32 bytes holding each code's fifth bit before the nibbles.
* Q6_K, 210 bytes: 128 bytes of low nibbles | 64 bytes of 2-bit high parts | sixteen int8
  scales | d (fp16). Element value = d * scale_j * (q - 32), sub-blocks of 16.

Scales come from the searches in search.py; the sub-block scales are then quantized to 6
(or 8) bits against the block's fp16 super-scale, and the codes are recomputed against the
scales as they will be decoded, so the rounding of the scales is not paid twice.
"""
from __future__ import annotations

import torch

from .bits import assemble, divide, fp16_bytes, pack_nibbles, safe_reciprocal
from .search import affine_search, symmetric_search


def _sub_block_weights(sub: torch.Tensor) -> torch.Tensor:
    """Importance of each element: the sub-block's RMS plus its own magnitude (large values matter more)."""
    mean_square = (sub * sub).sum(-1, keepdim=True, dtype=torch.float64) / sub.shape[-1]  # float64: see search.py
    return mean_square.float().sqrt() + sub.abs()


def _six_bit(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sub-block non-negative values [nb, 8] -> (6-bit integers [nb, 8], fp16 super-scale [nb, 1])."""
    peak = values.amax(-1, keepdim=True)
    step = divide(peak, 63)
    codes = torch.round(values * safe_reciprocal(step)).clamp(0, 63)
    return codes.to(torch.uint8), step.to(torch.float16)


def _pack_scales(scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """Eight 6-bit scales and eight 6-bit mins -> the 12-byte K-quant scale field."""
    low_s, high_s, low_m, high_m = scales[:, :4], scales[:, 4:], mins[:, :4], mins[:, 4:]
    return assemble(low_s | ((high_s >> 4) << 6), low_m | ((high_m >> 4) << 6),
                    pack_nibbles(high_s & 0x0F, high_m & 0x0F))


def _affine_codes(blocks: torch.Tensor, *, nmax: int, rmin: float, nstep: int):
    """Shared by Q4_K and Q5_K: (fp16 d, fp16 dmin, scale field, codes [nb, 8, 32])."""
    sub = blocks.reshape(-1, 8, 32)
    scale, offset = affine_search(sub, _sub_block_weights(sub), nmax=nmax, rmin=rmin, rdelta=0.1, nstep=nstep)
    scale_codes, d = _six_bit(scale.clamp(min=0))
    min_codes, dmin = _six_bit(offset)
    d, dmin, codes = _refit_super_scales(sub, scale_codes, min_codes, d, dmin, nmax)
    scale_codes, min_codes, codes, error = _refit_sub_scales(sub, scale_codes, min_codes, d, dmin, codes, nmax)
    d, dmin, codes = _refit_super_scales(sub, scale_codes, min_codes, d, dmin, nmax)
    return d, dmin, _pack_scales(scale_codes, min_codes), codes


def _refit_sub_scales(sub, scale_codes, min_codes, d, dmin, codes, nmax):
    """With the super-scales and codes fixed, each sub-block's least-squares (scale, min), rounded to
    6 bits against them; a block keeps the new integers where they decode closer."""
    _, error = _affine_decode_codes(sub, scale_codes, min_codes, d, dmin, nmax)
    q = codes.double()
    x = sub.double()
    n = sub.shape[-1]
    sq, sqq, sx, sqx = q.sum(-1), q.square().sum(-1), x.sum(-1), (q * x).sum(-1)
    det = n * sqq - sq * sq
    ok = det > 0
    safe = torch.where(ok, det, torch.ones_like(det))
    alpha = torch.where(ok, (n * sqx - sq * sx) / safe, torch.zeros_like(det))      # x ~ alpha * q - beta
    beta = torch.where(ok, (sq * sqx - sqq * sx) / safe, -sx / n)
    new_s = torch.round(alpha * safe_reciprocal(d.double())).clamp(0, 63).to(torch.uint8)
    new_m = torch.round(beta.clamp(min=0) * safe_reciprocal(dmin.double())).clamp(0, 63).to(torch.uint8)
    new_codes, new_error = _affine_decode_codes(sub, new_s, new_m, d, dmin, nmax)
    better = new_error < error
    keep = better.unsqueeze(-1)
    return (torch.where(keep, new_s, scale_codes), torch.where(keep, new_m, min_codes),
            torch.where(keep.unsqueeze(-1), new_codes.to(torch.uint8), codes), torch.minimum(new_error, error))


def _affine_decode_codes(sub, scale_codes, min_codes, d, dmin, nmax):
    """Codes for fixed (fp16) super-scales and 6-bit sub-block scales, and each block's squared error."""
    step = (d.float() * scale_codes.float()).unsqueeze(-1)              # [nb, 8, 1] decoded sub-block scales
    shift = (dmin.float() * min_codes.float()).unsqueeze(-1)
    codes = torch.round((sub + shift) * safe_reciprocal(step)).clamp_(0, nmax)
    error = (codes * step - shift - sub).square_().sum((1, 2), dtype=torch.float64)  # float64: see search.py
    return codes, error


def _refit_super_scales(sub, scale_codes, min_codes, d, dmin, nmax, rounds: int = 2):
    """Least-squares refit of the two fp16 super-scales over the whole 256-element block.

    With the integer sub-block scales s_j, mins m_j and codes L fixed, every element is
    ``d * (s_j * L) - dmin * m_j``: linear in (d, dmin), so the best pair solves a 2x2 system.
    The first choice (largest scale / 63) only makes the largest sub-block exact; the refit
    spreads the rounding of the 6-bit scales over all of them. Codes are then re-rounded against
    the refitted scales, and a block keeps whichever of old and new decodes closer (unweighted
    squared error: the weight RMSE is what is measured).
    """
    codes, error = _affine_decode_codes(sub, scale_codes, min_codes, d, dmin, nmax)
    s, m = scale_codes.double().unsqueeze(-1), min_codes.double().unsqueeze(-1)  # [nb, 8, 1]
    x = sub.double()
    for _ in range(rounds):
        a = s * codes.double()                                          # coefficient of d, [nb, 8, 32]
        saa = a.square().sum((1, 2))
        sab = (a * m).sum((1, 2))                                       # coefficient of dmin is -m_j
        sbb = m.square().squeeze(-1).sum(-1) * sub.shape[-1]
        sax = (a * x).sum((1, 2))
        sbx = (m * x).sum((1, 2))
        det = saa * sbb - sab * sab
        ok = det > 1e-30 * saa * sbb
        safe = torch.where(ok, det, torch.ones_like(det))
        new_d = torch.where(ok, (sbb * sax - sab * sbx) / safe, sax / torch.where(saa > 0, saa, torch.ones_like(saa)))
        new_dmin = torch.where(ok, (sab * sax - saa * sbx) / safe, dmin.double().squeeze(-1))
        new_d = new_d.clamp(min=0).to(torch.float16).unsqueeze(-1)
        new_dmin = new_dmin.clamp(min=0).to(torch.float16).unsqueeze(-1)
        finite = torch.isfinite(new_d.float()) & torch.isfinite(new_dmin.float())
        new_d, new_dmin = torch.where(finite, new_d, d), torch.where(finite, new_dmin, dmin)
        new_codes, new_error = _affine_decode_codes(sub, scale_codes, min_codes, new_d, new_dmin, nmax)
        better = new_error < error
        d, dmin = torch.where(better.unsqueeze(-1), new_d, d), torch.where(better.unsqueeze(-1), new_dmin, dmin)
        codes = torch.where(better.view(-1, 1, 1), new_codes, codes)
        error = torch.minimum(new_error, error)
    return d, dmin, codes.to(torch.uint8)


def _nibble_pairs(codes: torch.Tensor) -> torch.Tensor:
    """[nb, 8, 32] codes -> [nb, 128]: sub-blocks 2i and 2i+1 share 32 bytes (low, high nibble)."""
    return pack_nibbles(codes[:, 0::2], codes[:, 1::2]).reshape(codes.shape[0], -1)


def q4_k(blocks: torch.Tensor) -> torch.Tensor:
    d, dmin, scales, codes = _affine_codes(blocks, nmax=15, rmin=-1.0, nstep=20)
    return assemble(fp16_bytes(d), fp16_bytes(dmin), scales, _nibble_pairs(codes))


def q5_k(blocks: torch.Tensor) -> torch.Tensor:
    d, dmin, scales, codes = _affine_codes(blocks, nmax=31, rmin=-0.5, nstep=15)
    bit_weights = (1 << torch.arange(8, device=codes.device, dtype=torch.int32)).view(1, 8, 1)
    high = (((codes >> 4) & 1).to(torch.int32) * bit_weights).sum(1).to(torch.uint8)   # bit b <- sub-block b
    return assemble(fp16_bytes(d), fp16_bytes(dmin), scales, high, _nibble_pairs(codes & 0x0F))


def q6_k(blocks: torch.Tensor) -> torch.Tensor:
    sub = blocks.reshape(-1, 16, 16)
    scale = symmetric_search(sub, nmax=32)                                             # [nb, 16], signed
    peak = scale.gather(-1, scale.abs().argmax(-1, keepdim=True))                      # keeps its sign
    d = divide(peak, -128).to(torch.float16)
    scale_codes = torch.round(scale * safe_reciprocal(d.float())).clamp(-128, 127)
    step = (d.float() * scale_codes).unsqueeze(-1)
    codes = (torch.round(sub * safe_reciprocal(step)).clamp(-32, 31) + 32).to(torch.uint8).reshape(-1, 256)
    return assemble(_q6_low(codes), _q6_high(codes), scale_codes.to(torch.int8).view(torch.uint8), fp16_bytes(d))


def _q6_low(codes: torch.Tensor) -> torch.Tensor:
    """Per 128-element half: byte j holds elements j (low nibble) and 64 + j (high nibble)."""
    halves = (codes & 0x0F).reshape(-1, 2, 2, 64)
    return pack_nibbles(halves[:, :, 0], halves[:, :, 1]).reshape(codes.shape[0], -1)


def _q6_high(codes: torch.Tensor) -> torch.Tensor:
    """Per 128-element half: byte j holds bits 4-5 of elements j, 32 + j, 64 + j, 96 + j (2 bits each)."""
    quarters = ((codes >> 4) & 3).reshape(-1, 2, 4, 32).to(torch.int32)
    shifts = torch.tensor([0, 2, 4, 6], device=codes.device, dtype=torch.int32).view(1, 1, 4, 1)
    return (quarters << shifts).sum(2).to(torch.uint8).reshape(codes.shape[0], -1)
