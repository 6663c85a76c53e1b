"""The grid heuristic of oneDNN v3.12's AMX brgemm matmul for a plain bf16 src: ``matmul_amx_blocking_params_macro_t``
(src/cpu/x64/matmul/amx_blocking_heuristics.cpp), with the constants and cache geometry both AMX heuristics
read. :mod:`.matmul_amx` sizes the scratchpad from the blocking it picks.
"""

from __future__ import annotations

import numpy as np

from nnmem.frontends.pytorch.workspace._common import div_up, round_up

_L1 = 48 * 1024  # per-core L1d of the AMX Xeons (cpuid leaf 4)
_L2 = 2 * 1024 * 1024  # per-core L2
_L2_WAYS, _L2_SETS = 16, 2048
_L1_THR = 5 * _L1 // 6  # matmul_amx_blocking_params_t::L1_threshold
_L2_THR = 3 * _L2 // 4  # ::L2_threshold
_L2_WAYS_THR = 3 * _L2_WAYS // 4  # ::L2_ways_threshold
_BF16, _F32 = 2, 4
_WEI_K_BLK = 32  # get_wei_k_blk(bf16): 16 x VNNI 2
_TILE = 1024  # brgemm_desc_t::tilesize
_F = np.float32




def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _tmul_size(n: int, full: int) -> int:
    """``determine_tmul_size``."""
    return div_up(n, div_up(n, full))


class _Macro:
    """``matmul_amx_blocking_params_macro_t`` for a plain bf16 src and a plain or transposed (``ba``) weight
    copied to the blocked buffer B (no post-ops: ``postops_inst_count`` 0)."""

    def __init__(self, m: int, k: int, n: int, batch: int, nthr: int, b_transposed: bool) -> None:
        self.M, self.K, self.N, self.batch, self.nthr = m, k, n, batch, nthr
        self.transposed_B = b_transposed
        self.nthr_ = nthr
        self.nthr_m = self.nthr_n = self.nthr_k = self.nthr_b = 1
        self.m_per = self.k_per = self.n_per = self.b_per = 0
        self.m_tmul = self.n_tmul = self.k_tmul = 0
        self.m_dec = self.n_dec = 32
        self.m_blk = self.m_chunk = self.n_blk = self.n_chunk = self.k_blk = self.k_chunk = 0
        self.is_horizontal = False
        self.is_a_nt = True
        self.need_prefetch_a = self.need_prefetch_b = self.fused = self.extendable_k = False
        self.buf_c = False
        self.score = _F(0)

    def copy(self) -> _Macro:
        other = _Macro.__new__(_Macro)
        other.__dict__.update(self.__dict__)
        return other

    def set_core_divs(self, b: int, m: int, k: int, n: int) -> None:
        self.nthr_b, self.nthr_m, self.nthr_k, self.nthr_n = b, m, k, n
        self.m_per, self.k_per = div_up(self.M, m), div_up(self.K, k)
        self.n_per, self.b_per = div_up(self.N, n), div_up(self.batch, b)

    def set_tmul_sizes(self) -> None:
        self.m_tmul, self.n_tmul, self.k_tmul = _tmul_size(self.m_per, 16), 16, min(_WEI_K_BLK, self.K)

    def set_decomposition(self) -> None:
        self.m_dec, self.n_dec = min(self.M, 2 * self.m_tmul), min(self.N, 2 * self.n_tmul)

    def divs_ok(self) -> bool:
        min_k, min_mn, k_write, n_write = 256 // _BF16, 64 // _BF16, 256 // _BF16, 256 // _BF16
        bad_m = round_up(self.m_per, self.m_tmul) < min_mn and self.nthr_m > 1
        bad_k = self.k_per < min_k and self.nthr_k > 1
        n_min = n_write if self.nthr_k == 1 and self.k_per < k_write else min_mn
        bad_n = round_up(self.n_per, self.n_tmul) < n_min and self.nthr_n > 1
        return not (bad_m or bad_k or bad_n or self.nthr_b > self.batch)

    def skip_extendable_k(self) -> bool:
        def fits(kk: int) -> bool:
            ops = div_up(kk, 64 // _BF16)
            tile = kk // ops
            return kk % ops == 0 and tile <= 64 // _BF16 and tile % 2 == 0
        tail = self.K % self.k_blk
        return fits(self.k_blk) and fits(tail) if tail else fits(self.k_blk)

    def small_dims(self) -> bool:
        """``maybe_small_dims_heuristics``."""
        M, K, N, nthr = self.M, self.K, self.N, self.nthr
        if self.batch != 1:
            return False
        if M <= 32 and self.transposed_B:  # b_is_not_flat: buffer B is always used here
            self.n_dec, self.m_dec = min(N, 32), M
            n_per_core = round_up(div_up(N, nthr), self.n_dec)
            self.set_core_divs(1, 1, 1, div_up(N, n_per_core))
            if self.nthr_n < 0.75 * self.nthr_:
                return False
            if M * K > _L2_THR:
                return False
            self.m_blk, self.m_chunk, self.n_blk, self.n_chunk = M, 1, self.n_dec, n_per_core // self.n_dec
        elif K <= _WEI_K_BLK:
            m_per_core = div_up(M, nthr)
            self.set_core_divs(1, div_up(M, m_per_core), 1, 1)
            self.set_tmul_sizes()
            self.set_decomposition()
            if self.nthr_m < 0.75 * self.nthr_:
                return False
            self.m_blk, self.m_chunk = self.m_dec, div_up(m_per_core, self.m_dec)
            b_size, b_size_tr, d_size = N * K, N * round_up(K, _WEI_K_BLK), N * self.m_dec
            self.n_chunk = div_up(b_size + b_size_tr + d_size, _L2_THR)
            self.n_blk = round_up(div_up(N, self.n_chunk), 32)
        elif N <= 32:
            m_per_core = div_up(M, nthr)
            self.m_per = m_per_core
            self.m_dec = _tmul_size(m_per_core, 32)
            self.n_tmul, self.n_dec, self.k_tmul = 16, 32, min(_WEI_K_BLK, K)
            self.set_core_divs(1, div_up(M, round_up(m_per_core, self.m_dec)), 1, 1)
            if self.nthr_m < 0.75 * self.nthr_:
                return False
            self.m_blk, self.m_chunk, self.n_blk, self.n_chunk = self.m_dec, div_up(m_per_core, self.m_dec), N, 1
        else:
            return False
        self.k_blk, self.k_chunk, self.buf_c = K, 1, False
        self.extendable_k = K % _WEI_K_BLK != 0 and not self.skip_extendable_k()
        self.need_prefetch_a = self.need_prefetch_b = self.fused = False
        self.score = _F(1)
        return True

    # ---- the grid: calculate_blocking_scores and set_blocking_parameters ----
    def calc_k_blk(self, l1_dim: int) -> int:
        c_tiles = self.m_dec * self.n_dec * _F32
        d_tiles = self.m_dec * round_up(self.n_dec * _BF16, 64)
        largest_k = (_L1_THR - (c_tiles * 2 + d_tiles)) // (l1_dim * _BF16)
        k_tiles_per_thr = div_up(div_up(self.K, self.k_tmul), self.nthr_k)
        num_k_blocks = div_up(k_tiles_per_thr, largest_k // self.k_tmul)
        return min(div_up(k_tiles_per_thr, num_k_blocks) * self.k_tmul, self.K)

    @staticmethod
    def candidates(per_thread: int, dec: int) -> list[int]:
        inner = div_up(per_thread, dec)
        return sorted({div_up(inner, g) for g in range(1, inner + 1)})

    def l2_usage(self, k_chunk: int, mn_blk: int, k_blk: int, horizontal: bool, force_l2: bool = False) -> int:
        dec = self.m_dec if horizontal else self.n_dec
        kk = min(k_blk * k_chunk, self.k_per)
        l1_m, l2_m = 2 * dec * kk * _BF16, mn_blk * kk * _BF16
        if force_l2:
            l2_m += mn_blk * k_blk * k_chunk * _BF16
        c_post = (2 * self.m_dec * round_up(mn_blk * _BF16, 64) if horizontal
                  else 2 * round_up(self.n_dec * _BF16, 64) * mn_blk)
        c_tmp = 2 * self.m_dec * self.n_dec * _F32 if k_blk == self.K else 2 * dec * mn_blk * _F32
        return l1_m + l2_m + c_tmp + c_post

    def l2_and_c_usage(self, k_chunk: int, mn_blk: int, k_blk: int, horizontal: bool) -> int:
        per = self.m_per if horizontal else self.n_per
        kk = min(k_blk * k_chunk, self.k_per)
        return 2 * per * kk * _BF16 + 2 * mn_blk * kk * _BF16 + per * mn_blk * _F32

    def ratio(self, m_blk: int, k_chunk: int, k_blk: int, n_blk: int, horizontal: bool) -> np.float32:
        kk = min(k_blk * k_chunk, self.k_per)
        c_bw = 0
        if not ((self.l2_and_c_usage(k_chunk, n_blk if horizontal else m_blk, k_blk, horizontal) < _L2_THR
                 or kk == self.K) and self.nthr_k == 1):
            c_bw = m_blk * n_blk * _F32
        return _F(m_blk * kk * n_blk) / _F(m_blk * kk * _BF16 + n_blk * kk * _BF16 + c_bw)

    def single_core(self, k_chunk: int, mn_blk: int, k_blk: int, horizontal: bool, force_l2: bool = False
                    ) -> np.float32:
        if self.l2_usage(k_chunk, mn_blk, k_blk, horizontal, force_l2) <= _L2_THR:
            if horizontal:
                return self.ratio(self.m_dec, k_chunk, k_blk, mn_blk, True)
            return self.ratio(mn_blk, k_chunk, k_blk, self.n_dec, False)
        return _F(0)

    def set_blocking(self, force_horizontal: bool = False, force_l2: bool = False) -> bool:
        """``set_blocking_parameters`` (no post-ops: never post-ops bound)."""
        M, K, N = self.M, self.K, self.N
        m_cands = self.candidates(self.m_per, self.m_dec)
        n_cands = self.candidates(self.n_per, self.n_dec)
        st = {"h_no": False, "v_no": force_horizontal, "best_h": _F(0), "best_v": _F(0),
              "k_h": 0, "n_h": 0, "m_v": 0, "k_v": 0}

        def calc_h(k_blk_h: int, min_k_chunk: int = 0) -> None:
            if (round_up(self.m_per, self.m_dec) * (self.nthr_m - 1) >= M
                    or round_up(self.k_per, k_blk_h) * (self.nthr_k - 1) >= K):
                st["h_no"] = True
            else:
                k_cands = self.candidates(self.k_per, k_blk_h)
                st["n_h"] = 0
                for n_c in reversed(n_cands):
                    for k_c in reversed(k_cands):
                        s = self.single_core(k_c, n_c * self.n_dec, k_blk_h, True, force_l2)
                        if s > st["best_h"] and k_c >= min_k_chunk:
                            st["best_h"], st["k_h"], st["n_h"] = s, k_c, n_c
                if st["n_h"] == 0:
                    st["h_no"] = True
                    return
                if round_up(self.n_per, st["n_h"] * self.n_dec) * (self.nthr_n - 1) >= N:
                    st["h_no"] = True
                if round_up(self.k_per, st["k_h"] * k_blk_h) * (self.nthr_k - 1) >= K:
                    st["h_no"] = True

        k_blk_h = self.calc_k_blk(self.m_dec)
        calc_h(k_blk_h)

        def calc_v(k_blk_v: int) -> None:
            if (round_up(self.n_per, self.n_dec) * (self.nthr_n - 1) >= N
                    or round_up(self.k_per, k_blk_v) * (self.nthr_k - 1) >= K):
                st["v_no"] = True
            else:
                k_cands = self.candidates(self.k_per, k_blk_v)
                for m_c in reversed(m_cands):
                    for k_c in reversed(k_cands):
                        s = self.single_core(k_c, m_c * self.m_dec, k_blk_v, False)
                        if s > st["best_v"]:
                            st["best_v"], st["k_v"], st["m_v"] = s, k_c, m_c
                if st["m_v"] == 0:
                    st["v_no"] = True
                    return
                if round_up(self.m_per, st["m_v"] * self.m_dec) * (self.nthr_m - 1) >= M:
                    st["v_no"] = True
                if round_up(self.k_per, st["k_v"] * k_blk_v) * (self.nthr_k - 1) >= K:
                    st["v_no"] = True
                l2_util = 0
                if not st["v_no"]:
                    l2_util = self.l2_and_c_usage(st["k_v"], st["m_v"] * self.m_dec, k_blk_v, False)
                    if l2_util > _L2_THR:
                        l2_util = self.l2_usage(st["k_v"], st["m_v"] * self.m_dec, k_blk_v, False)
                repeat = div_up(K, k_blk_v * st["k_v"]) != 1
                set_issues = div_up(K, k_blk_v * st["k_v"]) != self.nthr_k or l2_util * self.nthr_k >= _L2_THR
                if repeat and set_issues:
                    st["v_no"] = True
                line = _L2_SETS * 64
                stride = N * _BF16 % 4096 or 4096
                if line % stride == 0 and div_up(stride * self.m_per, line) >= _L2_WAYS_THR:
                    st["v_no"] = True

        k_blk_v = self.calc_k_blk(self.n_dec)
        calc_v(k_blk_v)
        if st["v_no"] and st["h_no"]:
            return False
        if st["h_no"]:
            horizontal = False
        elif st["v_no"] or self.m_per < self.m_tmul * 2:
            horizontal = True
        elif self.n_per < self.n_tmul * 2:
            horizontal = False
        else:
            horizontal = self.m_per >= self.n_per
        self.is_horizontal = horizontal
        if horizontal:
            l1_eff = div_up(K, k_blk_h)
            a_l1 = k_blk_h * self.m_dec * _BF16
            c_l1 = self.n_dec * self.m_dec * _F32
            d_post = self.m_dec * round_up(self.n_dec * _BF16, 64)
            self.is_a_nt = False
            if k_blk_h < K and l1_eff * a_l1 + 2 * c_l1 + d_post > _L1_THR:
                st["best_h"] = _F(0)
                calc_h(_WEI_K_BLK, k_blk_h // _WEI_K_BLK)
                k_blk_h = min(_WEI_K_BLK * st["k_h"], K)
                st["k_h"] = 1
                self.is_a_nt = True
            self.k_blk, self.k_chunk = k_blk_h, st["k_h"]
            self.n_blk, self.n_chunk = min(st["n_h"] * self.n_dec, N), 1
            self.m_blk = self.m_dec
            self.m_chunk = div_up(self.m_per, self.m_blk)
            self.need_prefetch_a, self.need_prefetch_b = self.m_per // self.m_blk >= 2, False
            self.fused = K % _WEI_K_BLK != 0 and self.n_blk >= self.n_dec * 3 and self.k_blk >= (64 // _BF16) * 4
            self.extendable_k = K % _WEI_K_BLK != 0 and not self.skip_extendable_k() and not self.fused
        else:
            self.k_blk, self.k_chunk = k_blk_v, st["k_v"]
            self.n_blk, self.n_chunk = self.n_dec, div_up(self.n_per, self.n_dec)
            self.m_blk, self.m_chunk = min(st["m_v"] * self.m_dec, M), 1
            self.is_a_nt = True
            self.need_prefetch_a, self.need_prefetch_b, self.fused = False, False, False  # buffer B: no prefetch
            self.extendable_k = K % _WEI_K_BLK != 0 and not self.skip_extendable_k()
        self.buf_c = self.nthr_k != 1 or self.k_blk != K
        self.score = self.scores()
        return True

    def scores(self) -> np.float32:
        """``calculate_blocking_scores`` in float32 (the bandwidths of ``bw_map_t``, no post-ops)."""
        f = _F
        l1_hit, l1_miss, l1_store_miss = f(106.41), f(106.41 / 2.28), f(106.41 / 2.85)
        llc = f(6.0)
        b_h = self.is_horizontal  # use_buffer_b: always on this path
        a_size = self.m_per * self.k_per * _BF16
        b_size = self.n_per * self.k_per * _BF16
        d_size = self.m_per * self.n_per * _BF16
        cycles_per_tmul = self.m_tmul * 64 * 16 // 1024
        c_sz = _BF16 if self.nthr_k == 1 else _F32
        if b_h:
            strip_dst = self.m_dec * self.n_per * c_sz
            tmuls = f(self.m_dec * self.k_per * self.n_per // (self.m_tmul * self.k_tmul * self.n_tmul))
            num_strip = f(div_up(self.m_per, self.m_dec))
            nt_miss = f(b_size)
            l1_reuse = f(div_up(self.n_blk, self.n_dec))
            s1_shared = f(b_size)
            s1_private = f(self.m_dec * self.k_per * _BF16 + strip_dst)
            s1_coef = self.nthr_m
            mid_shared = f(self.m_dec * self.k_per * _BF16)
            mid_private = f(strip_dst)
            mid_coef = max(1, self.nthr_n)
        else:
            strip_dst = self.n_dec * self.m_per * c_sz
            tmuls = f(self.n_dec * self.k_per * self.m_per // (self.m_tmul * self.k_tmul * self.n_tmul))
            num_strip = f(div_up(self.n_per, self.n_dec))
            nt_miss = f(a_size)
            l1_reuse = f(div_up(self.m_blk, self.m_dec))
            s1_shared = f(a_size)
            s1_private = f(self.n_dec * self.k_per * _BF16 + strip_dst)
            s1_coef = self.nthr_n
            mid_shared = f(self.n_dec * self.k_per * _BF16)
            mid_private = f(strip_dst)
            mid_coef = max(1, self.nthr_m)
        tmp_miss = mid_shared * f(2)
        tmp_hit = mid_shared * (l1_reuse - f(1))
        c_elems = f(self.m_blk * self.n_blk)
        c_post_miss = f(self.m_blk * div_up(self.n_blk, self.n_dec) * round_up(self.n_dec * _BF16, 64))
        c_post_total = f(self.m_blk * div_up(self.n_blk, self.n_dec) * div_up(self.n_dec, 16) * 64)
        c_post_hit = c_post_total - c_post_miss
        c_read_tmp = c_elems * f(_F32)
        c_tmp_bw = l1_hit if self.k_blk == self.K else l1_store_miss
        c_tmp_cycles = f(_F32) * c_elems * f(self.k_chunk) / c_tmp_bw
        c_l1 = c_post_miss / l1_store_miss + c_post_hit / l1_hit + c_read_tmp / l1_hit + c_tmp_cycles
        l1_cycles = tmp_miss / l1_miss + tmp_hit / l1_hit + nt_miss / l1_miss + c_l1
        mid_dram = mid_shared / _bw(mid_coef) + mid_private / _bw(1)
        mid_llc = (mid_private + mid_shared) / llc
        strip_tmul = tmuls * f(cycles_per_tmul)
        mid_cycles = max(mid_dram, mid_llc, l1_cycles, strip_tmul, f(0))
        if not b_h:  # vertical with buffer B: strips_b_tranform_v
            mid_dram = mid_private / _bw(1)
            mid_llc = mid_private / llc
            mid_cycles = mid_shared / _bw(mid_coef) + max(mid_dram, mid_llc, l1_cycles, strip_tmul, f(0))
            s1_cycles = s1_shared / _bw(s1_coef) + s1_private / _bw(1)
            b_h_cycles = f(0)
        else:
            l2_fit = self.l2_usage(self.k_chunk, self.n_blk, self.k_blk, True, True) < _L2_THR
            s1_cycles = mid_cycles if l2_fit else s1_shared / llc
            b_h_cycles = s1_shared / _bw(s1_coef)
        gemm = b_h_cycles + s1_cycles + (num_strip - f(1)) * mid_cycles
        reduction = f(0)
        if self.nthr_k != 1:
            if self.m_per * self.n_per * _F32 * 2 < _L2_THR and self.batch == 1:
                read_bytes = f(self.M * round_up(self.N, 16) * _F32 * (self.nthr_k - 1) // (self.nthr_m * self.nthr_n))
                bw = _bw(2) if a_size + b_size + d_size < _L2_THR else llc
                write_bytes = f(self.M * self.N * _BF16 // (self.nthr_m * self.nthr_n))
                reduction = read_bytes / bw + write_bytes / _bw(1) + f(25000)
            else:
                return f(0)
        total = (gemm + reduction) * f(self.b_per)
        peak = f(self.M * self.K * self.N * self.batch) / f((1024 // _BF16) * self.nthr)
        return f(peak / total)

    def better(self, other: _Macro) -> bool:
        """``operator>``."""
        if other.score > self.score:
            return False
        if other.score < self.score:
            return True
        if not self.is_horizontal and other.is_horizontal:
            return self.m_per * self.K + self.m_per * self.N < _L2_THR and other.is_a_nt
        if self.is_horizontal and not other.is_horizontal:
            return not (other.m_per * self.K + other.m_per * self.N < _L2_THR and self.is_a_nt)
        return self.m_chunk * self.n_chunk > other.m_chunk * other.n_chunk


def _bw(x: int) -> np.float32:
    """``bw_map_t::get_bw``: DRAM bandwidth shared by ``x`` cores, interpolated."""
    points = [(1, 2.28), (2, 0.9), (4, 2.39), (8, 2.98), (16, 3.31), (32, 4.06)]
    for i, (x1, y1) in enumerate(points):
        if x1 >= x:
            if i == 0:
                return _F(y1)
            x0, y0 = points[i - 1]
            return _F(y0) + (_F(y1) - _F(y0)) * _F(x - x0) / _F(x1 - x0)
    return _F(points[-1][1])


def _macro(m: int, k: int, n: int, batch: int, nthr: int, b_transposed: bool) -> _Macro | None:
    """``matmul_amx_blocking_params_macro_t::find_best_blocking``; None where its score is 0 (the micro
    heuristic then runs)."""
    best = _Macro(m, k, n, batch, nthr, b_transposed)
    cur = best.copy()
    if best.small_dims():
        return best
    for nthr_check in range(nthr, 0, -1):
        cur.nthr_ = nthr_check
        for b_div in range(1, nthr_check + 1):
            if nthr_check % b_div:
                continue
            for m_div in range(1, nthr_check // b_div + 1):
                if (nthr_check // b_div) % m_div:
                    continue
                for k_div in range(1, nthr_check // b_div // m_div + 1):
                    if (nthr_check // b_div // m_div) % k_div:
                        continue
                    cur.set_core_divs(b_div, m_div, k_div, nthr_check // b_div // m_div // k_div)
                    cur.set_tmul_sizes()
                    cur.set_decomposition()
                    if cur.divs_ok() and cur.set_blocking() and cur.better(best):
                        best = cur.copy()
    if not b_transposed and not best.is_horizontal:
        cur.nthr_ = best.nthr_b * best.nthr_m * best.nthr_n * best.nthr_k
        cur.set_core_divs(best.nthr_b, best.nthr_m, best.nthr_k, best.nthr_n)
        if cur.set_blocking(True) and cur.better(best):
            best = cur.copy()
        if cur.set_blocking(True, True) and cur.better(best):
            best = cur.copy()
    return best if best.score != 0 else None
