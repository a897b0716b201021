// pool_attention: bidirectional multi-head self-attention over the real positions of right-padded sequences
// (lm/attention.py attention_forward without its projections). qkv (B*T, 3C) holds q in columns [0, C),
// k in [C, 2C), v in [2C, 3C), head h owning columns [h D, (h + 1) D) of each, D = C / heads:
//   out[b, t, h D + d] = sum_{j < len_b} softmax_j(q_t . k_j * scale) v[j, h D + d]
// Padded keys (j >= len_b) get no weight; padded queries (t >= len_b) are written as 0.
// One workgroup of 64 per (b, head, t); the scores of one query stay in workgroup memory, so
// T <= MAX_T (1024). Dispatch: B * heads * T groups, folded into (x, y).

const MAX_T: u32 = 1024u;

struct Params { batch: u32, seq: u32, channels: u32, heads: u32, scale: f32, _p0: u32, _p1: u32, _p2: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> lengths: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> sc: array<f32, MAX_T>;
var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * nwg.x;
    let T = p.seq;
    let C = p.channels;
    if (r >= p.batch * p.heads * T) { return; }   // uniform per workgroup
    let t = r % T;
    let head = (r / T) % p.heads;
    let b = r / (T * p.heads);
    let D = C / p.heads;
    let len = min(lengths[b], T);
    let q0 = (b * T + t) * 3u * C + head * D;
    let o0 = (b * T + t) * C + head * D;
    var mx = -3.4028235e38;
    for (var j = li; j < len; j += 64u) {
        let k0 = (b * T + j) * 3u * C + C + head * D;
        var acc = 0.0;
        for (var d = 0u; d < D; d++) { acc = fma(qkv[q0 + d], qkv[k0 + d], acc); }
        let s = acc * p.scale;
        sc[j] = s;
        mx = max(mx, s);
    }
    red[li] = mx;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] = max(red[li], red[li + h]); }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    var s = 0.0;
    for (var j = li; j < len; j += 64u) {
        let e = exp(sc[j] - m);
        sc[j] = e;
        s += e;
    }
    red[li] = s;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    let inv = 1.0 / red[0];
    let real = t < len;
    for (var d = li; d < D; d += 64u) {
        var acc = 0.0;
        for (var j = 0u; j < len; j++) {
            acc = fma(sc[j], qkv[(b * T + j) * 3u * C + 2u * C + head * D + d], acc);
        }
        out[o0 + d] = select(0.0, acc * inv, real);
    }
}
