// moe_route: top-k routing of router logits (N, E): the k largest logits of each row, highest first (ties:
// lower expert index first), and gates = softmax over just those k logits. E <= 64, 1 <= k <= E.
// Writes idx (N, k) i32 and gates (N, k) f32. One thread per row. Dispatch: rows / 64, folded into (x, y).

struct Params { rows: u32, experts: u32, k: u32, _pad: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> idx: array<i32>;
@group(0) @binding(3) var<storage, read_write> gates: array<f32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = (wid.x + wid.y * nwg.x) * 64u + li;
    if (row >= p.rows) { return; }
    let base = row * p.experts;
    let out = row * p.k;
    var taken = vec2<u32>(0u, 0u);   // bit e set: expert e already chosen
    var top = -3.4028235e38;
    for (var j = 0u; j < p.k; j++) {
        var best = 0u;
        var best_v = -3.4028235e38;
        var found = false;
        for (var e = 0u; e < p.experts; e++) {
            let bit = 1u << (e % 32u);
            if ((taken[e / 32u] & bit) != 0u) { continue; }
            let v = logits[base + e];
            if (!found || v > best_v) { best = e; best_v = v; found = true; }
        }
        taken[best / 32u] |= 1u << (best % 32u);
        idx[out + j] = i32(best);
        gates[out + j] = best_v;   // the raw logit for now; normalised below
        if (j == 0u) { top = best_v; }
    }
    var s = 0.0;
    for (var j = 0u; j < p.k; j++) {
        let e = exp(gates[out + j] - top);
        gates[out + j] = e;
        s += e;
    }
    for (var j = 0u; j < p.k; j++) { gates[out + j] = gates[out + j] / s; }
}
