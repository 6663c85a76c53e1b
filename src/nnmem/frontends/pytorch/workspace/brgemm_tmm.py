"""``brgemm_blocking_tmm`` of oneDNN v3.12 (src/cpu/x64/brgemm/brgemm_utils.cpp): how a bfloat16 AMX brgemm
micro-kernel tiles its M x N block (the C tiles behind the tile workspace), shared by the AMX matmul
(:mod:`.matmul_amx`) and convolution (:mod:`.conv_bf16_amx`) ports.
"""

from __future__ import annotations

from dataclasses import dataclass

from nnmem.frontends.pytorch.workspace._common import div_up, round_up

_BF16 = 2
_L1_CACHE = 48 * 1024  # platform::get_per_core_cache_size(1) on the AMX Xeons; brgemm_blocking_tmm takes all of it




@dataclass(slots=True)
class Tmm:
    """The blocking ``brgemm_blocking_tmm`` settles on (mutable while it works)."""

    bd: int
    ld: int
    mask: list[int] | None
    bd_block: int = 0
    bdb: int = 0
    bdb_tail: int = 0
    bd_block2: int = 1
    ld_block: int = 16
    ldb: int = 0
    ldb_tail: int = 0
    ld_block2: int = 1
    ldb2: int = 0
    ldb2_tail: int = 0
    m_tail: bool = False

    def bdb_for(self, bd_block: int) -> tuple[int, int]:
        """``find_bdb_bd_mask``: blocks of rows, skipping masked-out rows between blocks (uker)."""
        if self.mask is None or self.bd == 0:
            return div_up(self.bd, bd_block), self.bd % bd_block
        bdb = tail = 0
        i = 0
        while i < self.bd:
            if self.mask[i] == 0:
                i += 1
                continue
            i += bd_block
            if i > self.bd:
                tail = self.bd - i + bd_block
            bdb += 1
        return bdb, tail

    def c_tiles(self) -> int:
        bd2 = self.bdb if self.bdb <= self.bd_block2 else self.bd_block2 + (1 if self.bdb_tail else 0)
        ld2 = self.ldb if self.ldb <= self.ld_block2 else self.ld_block2 + (1 if self.ldb_tail else 0)
        return bd2 * ld2


def blocking_tmm(bd: int, ld: int, reduce_dim: int, mask: list[int] | None, uker: bool = True) -> Tmm:
    """``brgemm_blocking_tmm`` for a bfloat16 brgemm without hints or extendable K: the uker
    (``can_dispatch_uker``) by default; ``uker=False`` stops after the decomposition, whose ``recalc_blocking``
    then leaves full blocks apart from the tails."""
    b = Tmm(bd, ld, mask, ldb=ld // 16, ldb_tail=ld % 16)

    def mask_block() -> bool:  # find_bd_block_for_bd_mask
        if mask is None or bd == 0:
            return False
        best, min_bdb = min(16, bd), None
        for blk in range(min(16, bd), 0, -1):
            bdb, tail = b.bdb_for(blk)
            if (min_bdb is None or bdb < min_bdb) and tail == 0:
                min_bdb, best = bdb, blk
        b.bd_block, b.bdb_tail, b.bdb = best, 0, min_bdb if min_bdb is not None else 2**31 - 1
        return True

    def by_ld() -> None:
        if b.bd_block2 == 1 and b.ldb > 0 and b.ldb_tail == 0:
            b.ld_block2 = 3 if b.ldb % 3 == 0 else 2 if b.ldb % 2 == 0 else 1
        else:
            b.ld_block2 = 2 if b.ldb > 0 and b.ldb % 2 == 0 and b.ldb_tail == 0 and b.bd_block2 < 3 else 1
        b.ldb2, b.ldb2_tail = b.ldb // b.ld_block2, b.ldb % b.ld_block2
        if b.ld_block2 == 1 and not b.m_tail and b.ldb_tail == 0:
            b.bd_block2 = 3 if b.bdb >= 3 else 2 if b.bdb >= 2 else 1

    def try_3x1(step: int) -> bool:
        b.m_tail = False
        if (step - 1) * 16 < bd < step * 16 and b.ldb_tail == 0:
            if not mask_block():
                b.bd_block, b.bdb, b.bdb_tail, b.m_tail = 16, div_up(bd, 16), bd % 16, True
            b.bd_block2 = step
            by_ld()
            return True
        return False

    def try_2x2() -> bool:
        if not mask_block():
            b.bd_block = next((m for m in range(16, 0, -1) if bd % m == 0), 0)
            if b.bd_block == 1:
                b.bd_block, b.bdb_tail = min(16, bd), bd % 16
                for i in range(16, 0, -1):
                    if bd % i > b.bdb_tail or bd % i == 0:
                        b.bd_block, b.bdb_tail = i, bd % i
                        if bd % i == 0:
                            break
            b.bdb, b.bdb_tail = bd // b.bd_block, bd % b.bd_block
        b.bd_block2 = 2 if b.bdb >= 2 else 1
        b.m_tail = False
        by_ld()
        return not (b.ld_block2 == 1 or b.bd_block2 == 1 or b.bd_block < 8)

    def recalc(bd_block: int, ld_block: int, bd_block2: int, ld_block2: int) -> None:
        if bd_block:
            b.bd_block = bd_block
            b.bdb, b.bdb_tail = b.bdb_for(bd_block)
            b.m_tail = b.bdb_tail != 0
        if ld_block:
            b.ld_block, b.ldb, b.ldb_tail = ld_block, div_up(ld, ld_block), ld % ld_block
        if bd_block2:
            b.bd_block2 = bd_block2 - (1 if not uker and b.bdb_tail and bd_block2 > 1 else 0)
        if ld_block2 and uker:
            b.ld_block2 = ld_block2
            b.ldb2, b.ldb2_tail = div_up(b.ldb, ld_block2), 0
        elif ld_block2:
            b.ld_block2 = ld_block2 - (1 if b.ldb_tail and ld_block2 > 1 else 0)
            full = b.ldb - (1 if b.ldb_tail else 0)
            b.ldb2, b.ldb2_tail = full // b.ld_block2, full % b.ld_block2

    if not (try_2x2() or try_3x1(3) or try_3x1(2)):
        try_2x2()
    recalc(b.bd_block, b.ld_block, b.bd_block2, b.ld_block2)
    if not uker:  # the hints' recalc_blocking (none given) repeats the tails' trim
        recalc(0, 0, b.bd_block2, b.ld_block2)
        return b
    bdb_block_tail = not (b.bd_block > 12 and bd % b.bd_block == 0 and mask is None)
    ldb_tail_16 = ld % 16 != 0
    if not bdb_block_tail and not ldb_tail_16:  # 1x(4|5) or (4|5)x1 for a K that fits L1 (K_koef 1)
        eff_k, low_k = reduce_dim * _BF16, (_L1_CACHE - 4 * 1024) // (6 * 16)
        k5 = low_k <= eff_k < (_L1_CACHE - 5 * 1024) // (5 * 16)
        k4 = low_k <= eff_k < (_L1_CACHE - 4 * 1024) // (4 * 16)
        if ld % 80 == 0 and k5 and bd > 32:
            recalc(0, 16, 1, 5)
        elif ld % 64 == 0 and k4 and bd > 32:
            recalc(0, 16, 1, 4)
        elif bd % 80 == 0 and k5 and ld > 32:
            recalc(0, 16, 5, 1)
        elif bd % 64 == 0 and k4 and ld > 32:
            recalc(16, 16, 4, 1)
    weak_ldb = b.ld_block < 8 or b.ldb_tail > 0
    weak_bdb = b.bd_block < 8 or b.bdb_tail > 0
    ldb_only, bdb_only = ldb_tail_16 and not bdb_block_tail, bdb_block_tail and not ldb_tail_16
    ld16, bd16 = round_up(ld, 16), round_up(bd, 16)
    if ldb_only and ld > 64 and b.ld_block < 8:
        recalc(0, 16, 2, 1)
    elif ldb_only and weak_ldb and ld16 in (64, 48, 32):
        recalc(0, 16, {64: 1, 48: 1, 32: 2}[ld16], {64: 4, 48: 3, 32: 2}[ld16])
    elif bd <= 16:
        recalc(bd, 16, 0, 0)
        recalc(0, 0, 1, min((3 if b.ldb > 4 else 4) if ldb_tail_16 else 5, div_up(ld, 16)))
    elif bdb_only and weak_bdb and bd > 64:
        recalc(16, 16, 1, 2)
    elif bdb_only and weak_bdb and bd16 in (64, 48):
        recalc(16, 16, bd16 // 16, 1)
    elif bdb_only and weak_bdb and bd16 == 32 and ld % 32 == 0:
        recalc(16, 16, 2, 2)
    elif ld <= 16:
        recalc(16, 16, 0, 0)
        recalc(0, 0, min((3 if b.bdb > 4 else 4) if b.bdb_tail else 5, div_up(bd, 16)), 1)
    elif bdb_block_tail and ldb_tail_16 and bd16 == 32 and ld16 == 32 and (weak_ldb or weak_bdb):
        recalc(16, 16, 2, 2)
    return b
