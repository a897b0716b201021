// conv1d_causal: depthwise causal convolution over time, y[b, t, c] = bias[c] + sum_k w[k, c] * x[b, t - k, c]
// (x is zero before t = 0; tap k multiplies the input k steps back). Shapes: x, y (B, T, C); w (K, C).
// The uniform is five u32 (seq_len, channels, kernel_size, batch, groups) as in seed-001; groups is 1
// (plain depthwise) and kept for the grouped variants. Dispatch: 1-D over B*T*C elements, 256 per group,
// folded into (x, y) when it exceeds the per-dimension limit.

override HAS_BIAS: bool = false;

struct ConvParams { seq_len: u32, channels: u32, kernel_size: u32, batch: u32, groups: u32 };

@group(0) @binding(0) var<uniform> p: ConvParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    let C = p.channels;
    if (i >= p.batch * p.seq_len * C) { return; }
    let c = i % C;
    let t = (i / C) % p.seq_len;
    var acc = 0.0;
    if (HAS_BIAS) { acc = bias[c]; }
    let kmax = min(p.kernel_size, t + 1u);
    for (var k = 0u; k < kmax; k++) {
        acc = fma(w[k * C + c], x[i - k * C], acc);
    }
    y[i] = acc;
}
