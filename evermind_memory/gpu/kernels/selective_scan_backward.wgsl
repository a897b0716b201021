// selective_scan_backward: gradients of the ungated Mamba-1 scan (selective_scan.wgsl) over one time window,
// walked from the window's last step to its first with the state gradient carried in `dh` between windows.
// Needs the window's states hs (B, t_len, D, N) (recomputed by selective_scan with WRITE_STATES) and the
// state h0 (B, D, N) entering the window.
// Entry `scan`: one thread per (d, n, b), dispatch (ceil(D / 64), N, B). Writes four per-(b, t, d, n) planes
// into `parts`: [0] dy h (-> dC, summed over d), [1] dh coef u (-> dB, over d), [2] dh coef B (-> du, over n),
// [3] dh dh_t/d(delta) (-> ddelta, over n); adds the window's dA_log into `da` (B, D, N).
// Entry `reduce_n`: 1-D over B * t_len * D: du (with the skip D dy) and ddelta. Entry `reduce_d`: 1-D over
// B * t_len * N: dB and dC. Both 256 per group, folded.

struct Params { seq_len: u32, d_state: u32, d_inner: u32, batch: u32, t0: u32, t_len: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;              // (B, L, D)
@group(0) @binding(2) var<storage, read> delta: array<f32>;          // (B, L, D)
@group(0) @binding(3) var<storage, read> a_log: array<f32>;          // (D, N)
@group(0) @binding(4) var<storage, read> bm: array<f32>;             // (B, L, N)
@group(0) @binding(5) var<storage, read> cm: array<f32>;             // (B, L, N)
@group(0) @binding(6) var<storage, read> dy: array<f32>;             // (B, L, D)
@group(0) @binding(7) var<storage, read> hs: array<f32>;             // (B, t_len, D, N)
@group(0) @binding(8) var<storage, read> h0: array<f32>;             // (B, D, N)
@group(0) @binding(9) var<storage, read_write> dh: array<f32>;       // (B, D, N), carried backwards
@group(0) @binding(10) var<storage, read_write> da: array<f32>;      // (B, D, N), accumulated
@group(0) @binding(11) var<storage, read_write> parts: array<f32>;   // (4, B, t_len, D, N)
@group(0) @binding(12) var<storage, read> d_skip: array<f32>;        // (D,)
@group(0) @binding(13) var<storage, read_write> du: array<f32>;      // (B, L, D)
@group(0) @binding(14) var<storage, read_write> ddelta: array<f32>;  // (B, L, D)
@group(0) @binding(15) var<storage, read_write> db: array<f32>;      // (B, L, N)
@group(0) @binding(16) var<storage, read_write> dc: array<f32>;      // (B, L, N)

fn softplus(v: f32) -> f32 {
    return max(v, 0.0) + log(1.0 + exp(-abs(v)));
}

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
fn scan(@builtin(global_invocation_id) gid: vec3<u32>) {
    let D = p.d_inner;
    let N = p.d_state;
    let L = p.seq_len;
    let d = gid.x;
    let n = gid.y;
    let b = gid.z;
    if (d >= D || n >= N || b >= p.batch) { return; }
    let al = a_log[d * N + n];
    let a = -exp(clamp(al, -10.0, 5.0));
    let inside = select(0.0, 1.0, al > -10.0 && al < 5.0);   // the clamp passes no gradient outside
    let sidx = (b * D + d) * N + n;
    let plane = p.batch * p.t_len * D * N;
    var g_h = dh[sidx];
    var acc_a = 0.0;
    for (var k = 0u; k < p.t_len; k++) {
        let tl = p.t_len - 1u - k;
        let t = p.t0 + tl;
        let i = (b * L + t) * D + d;
        let bi = (b * L + t) * N + n;
        let o = ((b * p.t_len + tl) * D + d) * N + n;
        let x = delta[i];
        let dt = softplus(x);
        let za = dt * a;
        let ea = exp(za);
        let coef = dt * expm1_over(za);          // (exp(dt a) - 1) / a
        var h_prev = h0[sidx];
        if (tl > 0u) { h_prev = hs[o - D * N]; }
        let g = dy[i];
        let gh = fma(cm[bi], g, g_h);            // dL/dh_t
        let uv = u[i];
        let bv = bm[bi];
        let bu = bv * uv;
        parts[o] = g * hs[o];
        parts[plane + o] = gh * coef * uv;
        parts[2u * plane + o] = gh * coef * bv;
        parts[3u * plane + o] = gh * ea * fma(a, h_prev, bu) * sigmoid(x);
        acc_a += gh * (dt * ea * a * h_prev + (dt * ea - coef) * bu);
        g_h = ea * gh;
    }
    dh[sidx] = g_h;
    da[sidx] += acc_a * inside;
}

@compute @workgroup_size(256, 1, 1)
fn reduce_n(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let e = (wid.x + wid.y * nwg.x) * 256u + li;   // over (B, t_len, D)
    let D = p.d_inner;
    let N = p.d_state;
    if (e >= p.batch * p.t_len * D) { return; }
    let d = e % D;
    let tl = (e / D) % p.t_len;
    let b = e / (D * p.t_len);
    let i = (b * p.seq_len + p.t0 + tl) * D + d;
    let plane = p.batch * p.t_len * D * N;
    var s_u = d_skip[d] * dy[i];
    var s_dt = 0.0;
    for (var n = 0u; n < N; n++) {
        s_u += parts[2u * plane + e * N + n];
        s_dt += parts[3u * plane + e * N + n];
    }
    du[i] = s_u;
    ddelta[i] = s_dt;
}

@compute @workgroup_size(256, 1, 1)
fn reduce_d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let e = (wid.x + wid.y * nwg.x) * 256u + li;   // over (B, t_len, N)
    let D = p.d_inner;
    let N = p.d_state;
    if (e >= p.batch * p.t_len * N) { return; }
    let n = e % N;
    let row = e / N;                                 // b * t_len + tl
    let tl = row % p.t_len;
    let b = row / p.t_len;
    let plane = p.batch * p.t_len * D * N;
    var s_c = 0.0;
    var s_b = 0.0;
    for (var d = 0u; d < D; d++) {
        let o = (row * D + d) * N + n;
        s_c += parts[o];
        s_b += parts[plane + o];
    }
    let bi = (b * p.seq_len + p.t0 + tl) * N + n;
    dc[bi] = s_c;
    db[bi] = s_b;
}
