// selective_scan: the Mamba-1 (S6) scan over a time window [t0, t0 + t_len), carrying the state between windows.
//   dt = softplus(delta), a = -exp(clamp(a_log, -10, 5)),
//   h_t = exp(dt a) h_{t-1} + (exp(dt a) - 1) / a * B_t u_t,
//   y_t[d] = (sum_n C_t[n] h_t[d, n] + D[d] u_t[d]) * (HAS_GATE ? silu(z_t[d]) : 1).
// Entry `scan`: one workgroup of 64 lanes per (d, n, b): dispatch grid D x N x B (seed-001: wid.x is d and
// wid.y is n, so a ceil(D/8) x ceil(N/8) grid leaves most of the state unscanned). Each 64-step tile is an
// inclusive Kogge-Stone scan of the affine maps h -> a h + b, then the tile's carry moves on. Writes
// part (B, t_len, D, N) = C h (or h itself when WRITE_STATES) and leaves the final state in `state`.
// Entry `reduce`: 1-D over B * t_len * D, 256 per group, folded: sums part over n, adds the skip, gates.

override WRITE_STATES: bool = false;
override HAS_GATE: bool = false;

struct Params { seq_len: u32, d_state: u32, d_inner: u32, batch: u32, t0: u32, t_len: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;              // (B, L, D)
@group(0) @binding(2) var<storage, read> delta: array<f32>;          // (B, L, D), before softplus
@group(0) @binding(3) var<storage, read> a_log: array<f32>;          // (D, N)
@group(0) @binding(4) var<storage, read> bm: array<f32>;             // (B, L, N)
@group(0) @binding(5) var<storage, read> cm: array<f32>;             // (B, L, N)
@group(0) @binding(6) var<storage, read> d_skip: array<f32>;         // (D,)
@group(0) @binding(7) var<storage, read> z: array<f32>;              // (B, L, D) gate, read only with HAS_GATE
@group(0) @binding(8) var<storage, read_write> y: array<f32>;        // (B, L, D)
@group(0) @binding(9) var<storage, read_write> part: array<f32>;     // (B, t_len, D, N)
@group(0) @binding(10) var<storage, read_write> state: array<f32>;   // (B, D, N), carried across windows

const TILE: u32 = 64u;

var<workgroup> wa: array<f32, 64>;
var<workgroup> wb: array<f32, 64>;

fn softplus(v: f32) -> f32 {
    return max(v, 0.0) + log(1.0 + exp(-abs(v)));   // never overflows
}

// expm1(v) / v without the cancellation of exp(v) - 1 near 0 (a short series there; exact 1 at v = 0).
fn expm1_over(v: f32) -> f32 {
    if (abs(v) < 0.1) {
        return 1.0 + v * (0.5 + v * (1.0 / 6.0 + v * (1.0 / 24.0 + v * (1.0 / 120.0 + v / 720.0))));
    }
    return (exp(v) - 1.0) / v;
}

fn sigmoid(v: f32) -> f32 {
    if (v >= 0.0) { return 1.0 / (1.0 + exp(-v)); }
    let e = exp(v);
    return e / (1.0 + e);
}

@compute @workgroup_size(64, 1, 1)
fn scan(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let D = p.d_inner;
    let N = p.d_state;
    let L = p.seq_len;
    let d = wid.x;
    let n = wid.y;
    let b = wid.z;
    if (d >= D || n >= N || b >= p.batch) { return; }   // uniform per workgroup
    let a = -exp(clamp(a_log[d * N + n], -10.0, 5.0));
    let sidx = (b * D + d) * N + n;
    var h = state[sidx];
    for (var s = 0u; s < p.t_len; s += TILE) {
        let tl = s + li;
        var ea = 1.0;
        var eb = 0.0;
        if (tl < p.t_len) {
            let t = p.t0 + tl;
            let i = (b * L + t) * D + d;
            let dt = softplus(delta[i]);
            let za = dt * a;
            ea = exp(za);
            eb = dt * expm1_over(za) * bm[(b * L + t) * N + n] * u[i];
        }
        wa[li] = ea;
        wb[li] = eb;
        workgroupBarrier();
        // Compose with the map `off` steps earlier: (a2, b2) after (a1, b1) is (a2 a1, a2 b1 + b2).
        for (var off = 1u; off < TILE; off <<= 1u) {
            var na = wa[li];
            var nb = wb[li];
            if (li >= off) {
                nb = fma(na, wb[li - off], nb);
                na = na * wa[li - off];
            }
            workgroupBarrier();
            wa[li] = na;
            wb[li] = nb;
            workgroupBarrier();
        }
        let ht = fma(wa[li], h, wb[li]);
        if (tl < p.t_len) {
            let o = ((b * p.t_len + tl) * D + d) * N + n;
            if (WRITE_STATES) {
                part[o] = ht;
            } else {
                part[o] = cm[(b * L + p.t0 + tl) * N + n] * ht;
            }
        }
        let last = min(TILE, p.t_len - s) - 1u;
        h = fma(wa[last], h, wb[last]);
        workgroupBarrier();
    }
    if (li == 0u) { state[sidx] = h; }
}

@compute @workgroup_size(256, 1, 1)
fn reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let e = (wid.x + wid.y * nwg.x) * 256u + li;   // over (B, t_len, D)
    let D = p.d_inner;
    let N = p.d_state;
    if (e >= p.batch * p.t_len * D) { return; }
    let d = e % D;
    let tl = (e / D) % p.t_len;
    let b = e / (D * p.t_len);
    let i = (b * p.seq_len + p.t0 + tl) * D + d;
    var acc = d_skip[d] * u[i];
    let base = e * N;
    for (var n = 0u; n < N; n++) { acc += part[base + n]; }
    if (HAS_GATE) {
        let zv = z[i];
        acc *= zv * sigmoid(zv);
    }
    y[i] = acc;
}
