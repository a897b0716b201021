// sum_squares: the global gradient norm and the clip scale of a training step, computed on the device.
//   `partial`: partials[slot + g] = sum of x[i]^2 over the 4096 elements of workgroup g (fixed-order tree).
//   `finish`:  norm = sqrt(sum of partials[0 .. n_partials)) * unscale; factor = clip / (norm + 1e-6) when
//              clip > 0 and a finite norm exceeds it, else 1 (training/optim.py clip_factor); writes
//              ctl = [unscale * factor, norm] and flag[0] = 1 when the norm is not finite, else 0
//              (the flag is the AdamW kernel's drop-the-step flag). One workgroup.
//   `scale`:   g[i] *= ctl[0] (the gradient scale applied before the AdamW kernel, whose own scale is 1).
// Dispatch: partial and scale 1-D over n (4096 resp. 256 elements per group, folded); finish (1, 1, 1).

struct Params { n: u32, slot: u32, n_partials: u32, _p0: u32, unscale: f32, clip: f32, _p1: f32, _p2: f32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> partials: array<f32>;
@group(0) @binding(3) var<storage, read_write> ctl: array<f32>;
@group(0) @binding(4) var<storage, read_write> flag: array<u32>;
@group(0) @binding(5) var<storage, read_write> g: array<f32>;

var<workgroup> red: array<f32, 256>;

fn finite(v: f32) -> bool {
    return v == v && abs(v) <= 3.4028235e38;
}

@compute @workgroup_size(256, 1, 1)
fn partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let grp = wid.x + wid.y * nwg.x;
    let base = grp * 4096u;
    if (base >= p.n) { return; }   // uniform per workgroup
    var s = 0.0;
    for (var j = 0u; j < 16u; j++) {
        let i = base + j * 256u + li;
        if (i < p.n) { let v = x[i]; s = fma(v, v, s); }
    }
    red[li] = s;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    if (li == 0u) { partials[p.slot + grp] = red[0]; }
}

@compute @workgroup_size(256, 1, 1)
fn finish(@builtin(local_invocation_index) li: u32) {
    var s = 0.0;
    for (var j = li; j < p.n_partials; j += 256u) { s += partials[j]; }
    red[li] = s;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    if (li == 0u) {
        let norm = sqrt(red[0]) * p.unscale;
        let ok = finite(norm);
        var factor = 1.0;
        if (p.clip > 0.0 && ok && norm > p.clip) { factor = p.clip / (norm + 1e-6); }
        ctl[0] = p.unscale * factor;
        ctl[1] = norm;
        flag[0] = select(1u, 0u, ok);
    }
}

@compute @workgroup_size(256, 1, 1)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= p.n) { return; }
    g[i] = g[i] * ctl[0];
}
