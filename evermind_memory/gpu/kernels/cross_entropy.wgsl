// cross_entropy: per-row softmax cross-entropy and its gradient for logits (N, V), targets (N,) i32 and
// row weights (N,) f32 (1 / number of counted rows, 0 for padded rows):
//   loss_row[n] = weight[n] * (logsumexp(logits[n]) - logits[n, target[n]])
//   dlogits[n]  = weight[n] * (softmax(logits[n]) - onehot(target[n]))
// Rows with weight 0 get a zero gradient and zero loss (their target is never read).
// One workgroup of 256 threads per row. Dispatch: rows folded into (x, y) groups.

struct Params { rows: u32, cols: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<i32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> dlogits: array<f32>;
@group(0) @binding(5) var<storage, read_write> loss_row: array<f32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) { return; }
    let base = row * p.cols;
    let wt = weight[row];
    if (wt == 0.0) {
        for (var c = li; c < p.cols; c += 256u) { dlogits[base + c] = 0.0; }
        if (li == 0u) { loss_row[row] = 0.0; }
        return;
    }
    var mx = -3.4028235e38;
    for (var c = li; c < p.cols; c += 256u) { mx = max(mx, logits[base + c]); }
    red[li] = mx;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] = max(red[li], red[li + h]); }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    var s = 0.0;
    for (var c = li; c < p.cols; c += 256u) { s += exp(logits[base + c] - m); }
    red[li] = s;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    let total = red[0];
    let inv = 1.0 / total;
    let tgt = u32(targets[row]);
    for (var c = li; c < p.cols; c += 256u) {
        var g = exp(logits[base + c] - m) * inv;
        if (c == tgt) { g -= 1.0; }
        dlogits[base + c] = wt * g;
    }
    if (li == 0u) { loss_row[row] = wt * (log(total) + m - logits[base + tgt]); }
}
