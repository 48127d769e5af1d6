//! The layout's arithmetic: the order of a layer (crossings, swaps) and the coordinates
//! that keep a layer's order and spacing.

use super::ORDER_SWEEPS;

/// Positions as near as possible to `desired` (least squares), in order, each at least
/// `seps[i]` after the one before: pool-adjacent-violators on the positions less their
/// minimal offsets.
pub(super) fn fit(desired: &[f64], seps: &[f64]) -> Vec<f64> {
    let mut offset = Vec::with_capacity(desired.len());
    let mut acc = 0.0;
    for i in 0..desired.len() {
        if i > 0 {
            acc += seps[i - 1];
        }
        offset.push(acc);
    }
    // Blocks of (mean, count), non-decreasing means.
    let mut blocks: Vec<(f64, usize)> = Vec::new();
    for (d, o) in desired.iter().zip(&offset) {
        blocks.push((d - o, 1));
        while blocks.len() > 1 && blocks[blocks.len() - 2].0 > blocks[blocks.len() - 1].0 {
            let (m2, c2) = blocks.pop().expect("two blocks");
            let (m1, c1) = blocks.pop().expect("two blocks");
            let c = c1 + c2;
            blocks.push(((m1 * c1 as f64 + m2 * c2 as f64) / c as f64, c));
        }
    }
    blocks.iter().flat_map(|&(m, c)| std::iter::repeat_n(m, c)).zip(&offset).map(|(m, o)| m + o).collect()
}

/// Swaps neighbours within layers while that removes crossings.
pub(super) fn transpose(layers: &mut [Vec<usize>], up: &[Vec<usize>], down: &[Vec<usize>]) {
    let mut pos = vec![0usize; up.len()];
    for layer in layers.iter() {
        for (i, &v) in layer.iter().enumerate() {
            pos[v] = i;
        }
    }
    // The crossings among the edges of `v` and `w`, `v` left of `w`.
    let cross = |v: usize, w: usize, pos: &[usize]| -> usize {
        [up, down]
            .iter()
            .map(|adj| adj[v].iter().map(|&a| adj[w].iter().filter(|&&b| pos[a] > pos[b]).count()).sum::<usize>())
            .sum()
    };
    for _ in 0..ORDER_SWEEPS {
        let mut improved = false;
        for layer in layers.iter_mut() {
            for i in 1..layer.len() {
                let (v, w) = (layer[i - 1], layer[i]);
                if cross(w, v, &pos) < cross(v, w, &pos) {
                    layer.swap(i - 1, i);
                    pos[v] = i;
                    pos[w] = i - 1;
                    improved = true;
                }
            }
        }
        if !improved {
            break;
        }
    }
}

/// Edge crossings between consecutive layers.
pub(super) fn crossings(layers: &[Vec<usize>], down: &[Vec<usize>]) -> usize {
    let mut pos = vec![0usize; down.len()];
    for layer in layers {
        for (i, &v) in layer.iter().enumerate() {
            pos[v] = i;
        }
    }
    let mut total = 0;
    for layer in layers {
        let pairs: Vec<(usize, usize)> =
            layer.iter().flat_map(|&v| down[v].iter().map(move |&w| (v, w))).map(|(v, w)| (pos[v], pos[w])).collect();
        for (i, a) in pairs.iter().enumerate() {
            for b in &pairs[i + 1..] {
                if (a.0 < b.0 && a.1 > b.1) || (a.0 > b.0 && a.1 < b.1) {
                    total += 1;
                }
            }
        }
    }
    total
}
