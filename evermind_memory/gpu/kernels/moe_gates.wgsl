// moe_gates: top-k routing results as a dense gate matrix, and the router's backward from it.
// The dense layout has G = E + 1 columns per row: column 0 is the shared expert (gate 1), column 1 + e is
// routed expert e (its softmax gate when chosen, else 0), so all experts run as one wide matmul and an
// unchosen expert contributes exactly nothing (forward and backward).
//   `dense`:    gmat[n, 0] = 1; gmat[n, 1 + idx[n, j]] = gates[n, j]; every other entry 0.
//   `backward`: with dg_j = dgmat[n, 1 + idx[n, j]]: dlogits[n, idx[n, j]] = gates_j (dg_j - sum_i gates_i dg_i),
//               every other dlogits entry 0 (unselected logits get no gradient: top-k is piecewise constant).
// One thread per row. Dispatch: rows / 64 groups, folded into (x, y).

struct Params { rows: u32, experts: u32, k: u32, _p0: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> idx: array<i32>;
@group(0) @binding(2) var<storage, read> gates: array<f32>;
@group(0) @binding(3) var<storage, read_write> gmat: array<f32>;
@group(0) @binding(4) var<storage, read> dgmat: array<f32>;
@group(0) @binding(5) var<storage, read_write> dlogits: array<f32>;

@compute @workgroup_size(64, 1, 1)
fn dense(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let row = (wid.x + wid.y * nwg.x) * 64u + li;
    if (row >= p.rows) { return; }
    let g = p.experts + 1u;
    let base = row * g;
    gmat[base] = 1.0;
    for (var e = 1u; e < g; e++) { gmat[base + e] = 0.0; }
    for (var j = 0u; j < p.k; j++) {
        gmat[base + 1u + u32(idx[row * p.k + j])] = gates[row * p.k + j];
    }
}

@compute @workgroup_size(64, 1, 1)
fn backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let row = (wid.x + wid.y * nwg.x) * 64u + li;
    if (row >= p.rows) { return; }
    let g = p.experts + 1u;
    let out = row * p.experts;
    for (var e = 0u; e < p.experts; e++) { dlogits[out + e] = 0.0; }
    var dot = 0.0;
    for (var j = 0u; j < p.k; j++) {
        let s = row * p.k + j;
        dot = fma(gates[s], dgmat[row * g + 1u + u32(idx[s])], dot);
    }
    for (var j = 0u; j < p.k; j++) {
        let s = row * p.k + j;
        let e = u32(idx[s]);
        dlogits[out + e] = gates[s] * (dgmat[row * g + 1u + e] - dot);
    }
}
