// ssd: the Mamba-2 scan, chunked. Per head h (scalar decay) and head channel p:
//   dt = softplus(dt_raw + dt_bias[h]), a_t = exp(-softplus(a_log[h]) dt),
//   S_t[n, p] = a_t S_{t-1}[n, p] + B_t[g, n] x_t[h, p],  y_t[h, p] = sum_n C_t[g, n] S_t[n, p] + D[h] x_t[h, p],
// with B/C group g = h * G / H. Three entries, dispatched in this order:
//   `chunk`  workgroup per (chunk, head, batch) = grid (NC, H, B), 64 lanes over p: runs each chunk from a zero
//            state, writes y without the carried-in state, the chunk's final state into `states`
//            (NC, B, H, N, P) and cum (B, L, H) = prod of a from the chunk start to t.
//   `carry`  1-D over B*H*N*P: walks the chunks in order, replacing each chunk's final state by the state
//            entering it (S_in[c] = 0 for c = 0, then a_chunk S_in + S_local).
//   `output` 1-D over B*L*D: y_t += cum_t * sum_n C_t[n] S_in[chunk(t)][n, p].
// (The reference ran its chunks in parallel while each read the previous chunk's unfinished state.)
// Sizes through the uniform; N <= 64 (a private state array per lane).

struct Params {
    seq_len: u32, d_inner: u32, n_heads: u32, d_head: u32,
    n_groups: u32, d_state: u32, chunk_len: u32, n_chunks: u32,
    batch: u32, _p0: u32, _p1: u32, _p2: u32,
};

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;              // (B, L, H * P)
@group(0) @binding(2) var<storage, read> dt: array<f32>;             // (B, L, H), before bias and softplus
@group(0) @binding(3) var<storage, read> bm: array<f32>;             // (B, L, G * N)
@group(0) @binding(4) var<storage, read> cm: array<f32>;             // (B, L, G * N)
@group(0) @binding(5) var<storage, read> a_log: array<f32>;          // (H,)
@group(0) @binding(6) var<storage, read> dt_bias: array<f32>;        // (H,)
@group(0) @binding(7) var<storage, read> d_skip: array<f32>;         // (H,)
@group(0) @binding(8) var<storage, read_write> y: array<f32>;        // (B, L, H * P)
@group(0) @binding(9) var<storage, read_write> states: array<f32>;   // (NC, B, H, N, P)
@group(0) @binding(10) var<storage, read_write> cum: array<f32>;     // (B, L, H)

const MAX_N: u32 = 64u;

fn softplus(v: f32) -> f32 {
    return max(v, 0.0) + log(1.0 + exp(-abs(v)));
}

@compute @workgroup_size(64, 1, 1)
fn chunk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let c = wid.x;
    let hd = wid.y;
    let b = wid.z;
    let L = p.seq_len;
    let H = p.n_heads;
    let P = p.d_head;
    let N = p.d_state;
    let GN = p.n_groups * N;
    if (c >= p.n_chunks || hd >= H || b >= p.batch) { return; }
    let t_start = c * p.chunk_len;
    let t_end = min(t_start + p.chunk_len, L);
    let g = hd * p.n_groups / H;
    let neg_a = softplus(a_log[hd]);
    let bias = dt_bias[hd];
    let ds = d_skip[hd];
    for (var pp = li; pp < P; pp += 64u) {
        var h: array<f32, MAX_N>;
        for (var n = 0u; n < N; n++) { h[n] = 0.0; }
        var run = 1.0;
        for (var t = t_start; t < t_end; t++) {
            let a = exp(-neg_a * softplus(dt[(b * L + t) * H + hd] + bias));
            run *= a;
            if (pp == 0u) { cum[(b * L + t) * H + hd] = run; }
            let xi = (b * L + t) * H * P + hd * P + pp;
            let xv = x[xi];
            let bc = (b * L + t) * GN + g * N;
            var acc = ds * xv;
            for (var n = 0u; n < N; n++) {
                h[n] = fma(a, h[n], bm[bc + n] * xv);
                acc = fma(cm[bc + n], h[n], acc);
            }
            y[xi] = acc;
        }
        for (var n = 0u; n < N; n++) {
            states[(((c * p.batch + b) * H + hd) * N + n) * P + pp] = h[n];
        }
    }
}

@compute @workgroup_size(256, 1, 1)
fn carry(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let e = (wid.x + wid.y * nwg.x) * 256u + li;   // over (B, H, N, P)
    let H = p.n_heads;
    let per_chunk = p.batch * H * p.d_state * p.d_head;
    if (e >= per_chunk) { return; }
    let hd = (e / (p.d_state * p.d_head)) % H;
    let b = e / (H * p.d_state * p.d_head);
    var s = 0.0;
    for (var c = 0u; c < p.n_chunks; c++) {
        let idx = c * per_chunk + e;
        let local = states[idx];
        states[idx] = s;
        let t_last = min((c + 1u) * p.chunk_len, p.seq_len) - 1u;
        s = fma(cum[(b * p.seq_len + t_last) * H + hd], s, local);
    }
}

@compute @workgroup_size(256, 1, 1)
fn output(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;   // over (B, L, H * P)
    let H = p.n_heads;
    let P = p.d_head;
    let N = p.d_state;
    let L = p.seq_len;
    if (i >= p.batch * L * H * P) { return; }
    let pp = i % P;
    let hd = (i / P) % H;
    let t = (i / (H * P)) % L;
    let b = i / (L * H * P);
    let c = t / p.chunk_len;
    if (c == 0u) { return; }                     // the first chunk starts from a zero state
    let g = hd * p.n_groups / H;
    let bc = (b * L + t) * p.n_groups * N + g * N;
    var acc = 0.0;
    for (var n = 0u; n < N; n++) {
        acc = fma(cm[bc + n], states[(((c * p.batch + b) * H + hd) * N + n) * P + pp], acc);
    }
    y[i] += cum[(b * L + t) * H + hd] * acc;
}
