// conv1d_causal_backward: gradients of conv1d_causal.wgsl.
//   dx[b, t, c] = sum_k w[k, c] * dy[b, t + k, c]            (entry `dx`, one thread per element)
//   dw[k, c]    = sum_{b, t >= k} dy[b, t, c] * x[b, t - k, c]  (entry `dw`, one thread per (k, c))
//   db[c]       = sum_{b, t} dy[b, t, c]                       (entry `dw`, the k == 0 threads)
// Same five-u32 uniform as the forward. `dw` sums in a fixed order (deterministic); ACCUMULATE adds to
// dw/db (batch-tiled work). Dispatch: dx 1-D over B*T*C (256 per group); dw (ceil(C / 64), K, 1).

override ACCUMULATE: bool = false;

struct ConvParams { seq_len: u32, channels: u32, kernel_size: u32, batch: u32, groups: u32 };

@group(0) @binding(0) var<uniform> p: ConvParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<f32>;
@group(0) @binding(5) var<storage, read_write> dw: array<f32>;
@group(0) @binding(6) var<storage, read_write> db: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn dx_main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    let C = p.channels;
    let T = p.seq_len;
    if (i >= p.batch * T * C) { return; }
    let c = i % C;
    let t = (i / C) % T;
    var acc = 0.0;
    let kmax = min(p.kernel_size, T - t);
    for (var k = 0u; k < kmax; k++) {
        acc = fma(w[k * C + c], dy[i + k * C], acc);
    }
    dx[i] = acc;
}

@compute @workgroup_size(64, 1, 1)
fn dw_main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let C = p.channels;
    let T = p.seq_len;
    let c = wid.x * 64u + lid.x;
    let k = wid.y;
    if (c >= C || k >= p.kernel_size) { return; }
    var gw = 0.0;
    var gb = 0.0;
    for (var b = 0u; b < p.batch; b++) {
        let base = b * T * C + c;
        for (var t = k; t < T; t++) {
            gw = fma(dy[base + t * C], x[base + (t - k) * C], gw);
        }
        if (k == 0u) {
            for (var t = 0u; t < T; t++) { gb += dy[base + t * C]; }
        }
    }
    if (ACCUMULATE) {
        gw += dw[k * C + c];
        if (k == 0u) { gb += db[c]; }
    }
    dw[k * C + c] = gw;
    if (k == 0u) { db[c] = gb; }
}
