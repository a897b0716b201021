// moe_hidden: the hidden layer of all experts of a row at once, laid out (N, G * H): group g owns columns
// [g H, (g + 1) H) (group 0 the shared expert, 1 + e routed expert e), gmat (N, G) holds the gates.
//   `forward`:  pre[n, j] = relu(pre[n, j]) in place (the saved activation h), and
//               hs[n, j] = gmat[n, j / H] * h[n, j] (the gated hidden fed to the stacked w2).
//               1-D over N * G * H, 256 per group, folded.
//   `backward`: from dhs = d(hs): dgmat[n, g] (+)= sum_j dhs[n, j] h[n, j] over the group's columns, and
//               dhs[n, j] = gmat[n, g] * dhs[n, j] where h > 0, else 0, in place (now d(pre)).
//               One workgroup of 64 per (row, group), fixed-order tree sum; ACCUMULATE adds to dgmat.
//               Dispatch: N * G groups, folded.

override ACCUMULATE: bool = false;

struct Params { rows: u32, groups: u32, hidden: u32, _p0: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> pre: array<f32>;
@group(0) @binding(2) var<storage, read> gmat: array<f32>;
@group(0) @binding(3) var<storage, read_write> hs: array<f32>;
@group(0) @binding(4) var<storage, read> h: array<f32>;
@group(0) @binding(5) var<storage, read_write> dhs: array<f32>;
@group(0) @binding(6) var<storage, read_write> dgmat: array<f32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(256, 1, 1)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    let width = p.groups * p.hidden;
    if (i >= p.rows * width) { return; }
    let n = i / width;
    let grp = (i % width) / p.hidden;
    let v = max(pre[i], 0.0);
    pre[i] = v;
    hs[i] = gmat[n * p.groups + grp] * v;
}

@compute @workgroup_size(64, 1, 1)
fn backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * nwg.x;
    if (r >= p.rows * p.groups) { return; }   // uniform per workgroup
    let n = r / p.groups;
    let grp = r % p.groups;
    let gate = gmat[r];
    let base = n * p.groups * p.hidden + grp * p.hidden;
    var s = 0.0;
    for (var c = li; c < p.hidden; c += 64u) {
        let d = dhs[base + c];
        let hv = h[base + c];
        s = fma(d, hv, s);
        dhs[base + c] = select(0.0, gate * d, hv > 0.0);
    }
    red[li] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) { red[li] += red[li + k]; }
        workgroupBarrier();
    }
    if (li == 0u) {
        var v = red[0];
        if (ACCUMULATE) { v += dgmat[r]; }
        dgmat[r] = v;
    }
}
