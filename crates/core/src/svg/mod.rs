//! Rendering a machine as an SVG image, laid out here (no Graphviz, no IO).
//!
//! The image draws [`crate::edges`], labelled as in DOT (`auto: action`, `event
//! (timer every 5m)`), top to bottom, with a layered (Sugiyama) layout:
//!
//! 1. *Cycles* are broken by a depth-first search from the initial state: its back edges,
//!    and every edge into the initial state, are reversed for layering only.
//! 2. *Layers* are the longest path from the sources. Every edge gets a node of its own
//!    in the layer between its ends, holding its label (a long edge gets thin dummies in
//!    the other layers it crosses), so labels never sit on a state or on each other.
//! 3. *Order* within a layer: barycenter sweeps down and up, each followed by swaps of
//!    neighbours that remove crossings, keeping the order with the fewest crossings.
//! 4. *Coordinates*: each node is pulled towards the mean of its neighbours, the layer
//!    keeping its order and spacing (a least-squares fit, pool-adjacent-violators). A
//!    state is as wide as its name (7.5px a character) and 34px high.
//!
//! A composite state is laid out recursively: its children first, as a diagram of their
//! own (with its initial marker) inside the parent's box, below its title; the box is
//! then one node of the level above. An edge is laid out at the level where its ends are
//! in different boxes, and drawn between the actual states as a smooth curve through its
//! label: a state inside a composite is left or entered sideways, through the
//! composite's border, when no other state is in the way. An edge to itself, and one
//! between a composite and a state inside it, is a small loop on the right of the
//! (inner) state.
//!
//! Output contract (the dashboard relies on it): a root `<svg class="settle-diagram">`;
//! a flat `<g class="state …" data-state="…">` per state (composites first, children with
//! `data-parent`), classes `composite`, `terminal`, `unstable`, `error`; a `<g class="edge
//! [auto]" data-from data-to data-label>` per edge (the event, or the auto action); a
//! `<g class="start" data-initial="…">` per initial marker; and a `<style>` scoped under
//! `.settle-diagram` with rules for the classes the page adds (`lit`, `visited`).
//! The same machine always gives the same bytes.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

use crate::edges;
use crate::machine::{Machine, State};
use order::{crossings, fit, transpose};
use write::{attach, curve, num};

/// Width of a character of a state's name (13px font), and of an edge label (11px).
const CHAR_W: f64 = 7.5;
const LABEL_CHAR_W: f64 = 6.4;
/// A leaf state's height, and the padding either side of its name.
const NODE_H: f64 = 34.0;
const NODE_PAD: f64 = 14.0;
/// An edge label's background: height and padding either side.
const LABEL_H: f64 = 16.0;
const LABEL_PAD: f64 = 5.0;
/// A composite's title band, and the padding around its children.
const TITLE_H: f64 = 28.0;
const BOX_PAD: f64 = 14.0;
/// The band above a diagram's first layer holding the initial marker.
const START_BAND: f64 = 26.0;
/// Vertical gap between layers; horizontal gap between states, and around edge nodes.
const RANK_GAP: f64 = 14.0;
const NODE_GAP: f64 = 32.0;
const EDGE_GAP: f64 = 12.0;
/// How far a loop reaches right of its state (the control points lie at 4/3 of it).
const LOOP_REACH: f64 = 24.0;
/// How far outside its composite an edge from a state inside turns towards its target.
const STUB: f64 = 6.0;
/// Margin around the whole image.
const MARGIN: f64 = 12.0;
/// Rounds of barycenter sweeps, and of coordinate pulls.
const ORDER_SWEEPS: usize = 8;
const PLACE_SWEEPS: usize = 12;

/// Renders `machine` as a standalone SVG image (UTF-8 text ending with a newline),
/// laid out top to bottom as the [module documentation](self) describes.
///
/// ```
/// use settle_core::MachineBuilder;
/// let m = MachineBuilder::new("door")
///     .state("closed").initial()
///     .state("open")
///     .event("open", ["closed"], "do_open")
///     .event("close", ["open"], "do_close")
///     .action("do_open", ["open"])
///     .action("do_close", ["closed"])
///     .build()
///     .unwrap();
/// let svg = settle_core::svg::render(&m);
/// assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"settle-diagram\""));
/// assert!(svg.contains("<g class=\"state\" data-state=\"open\">"));
/// assert!(svg.contains("<g class=\"edge\" data-from=\"closed\" data-to=\"open\" data-label=\"open\">"));
/// ```
pub fn render(machine: &Machine) -> String {
    let layout = Layout::new(machine);
    let diagram = layout.diagram();
    layout.write(&diagram)
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Point {
    x: f64,
    y: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

impl Rect {
    fn cx(&self) -> f64 {
        self.x + self.w / 2.0
    }
    fn cy(&self) -> f64 {
        self.y + self.h / 2.0
    }
    fn right(&self) -> f64 {
        self.x + self.w
    }
    fn bottom(&self) -> f64 {
        self.y + self.h
    }
}

/// The laid out members of one level (the top, or a composite's children) and everything
/// inside them, relative to the level's top left corner.
#[derive(Default)]
struct Group {
    w: f64,
    h: f64,
    /// Every state at this level or below, with its box.
    rects: Vec<(usize, Rect)>,
    /// Every edge laid out at this level or below.
    routes: Vec<Route>,
    /// The initial markers: the state pointed at, the marker's centre.
    starts: Vec<(usize, Point)>,
}

impl Group {
    fn shift(&mut self, dx: f64, dy: f64) {
        let mv = |p: &mut Point| {
            p.x += dx;
            p.y += dy;
        };
        for (_, r) in &mut self.rects {
            r.x += dx;
            r.y += dy;
        }
        for route in &mut self.routes {
            route.points.iter_mut().for_each(mv);
            mv(&mut route.label);
        }
        for (_, p) in &mut self.starts {
            mv(p);
        }
    }

    fn absorb(&mut self, other: Group) {
        self.rects.extend(other.rects);
        self.routes.extend(other.routes);
        self.starts.extend(other.starts);
    }
}

/// Where an edge goes, as laid out at the level where its ends are in different members.
struct Route {
    edge: usize,
    /// The members of that level holding the edge's source and target (the states
    /// themselves, or composites they are in).
    from: usize,
    to: usize,
    /// The waypoints from the source's member to the target's (ends excluded); one of
    /// them is the label's centre.
    points: Vec<Point>,
    label: Point,
}

/// The direction a path leaves or enters a state's side.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dir {
    Vertical,
    Horizontal,
    /// Vertical nearly all the way to the next point: along a composite's border, after
    /// leaving it sideways.
    Riser,
}

/// What a layer holds: a state of the level, an edge's label, or a thin dummy of an edge
/// crossing the layer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    State,
    Label,
    Dummy,
}

/// A node of a level's layered graph, with its extent around its anchor (the centre of a
/// state's box; a state's loops widen it on the right).
struct Item {
    kind: Kind,
    rank: usize,
    left: f64,
    right: f64,
    h: f64,
}

/// An edge between two members of a level, by their index among the members.
struct Link {
    edge: usize,
    from: usize,
    to: usize,
}

/// The whole image: every state's box, every edge's path and label centre, the initial
/// markers.
struct Diagram {
    w: f64,
    h: f64,
    rects: Vec<Rect>,
    paths: Vec<(String, Point)>,
    starts: Vec<(usize, Point)>,
}

/// The machine, indexed for layout.
struct Layout<'m> {
    machine: &'m Machine,
    edges: Vec<edges::Edge<'m>>,
    /// Each edge's source and target, as indices into the machine's states.
    ends: Vec<(usize, usize)>,
    /// Each edge's label text.
    labels: Vec<String>,
    /// Each state's parent, and children in declaration order; the top-level states.
    parents: Vec<Option<usize>>,
    children: Vec<Vec<usize>>,
    roots: Vec<usize>,
    /// For each state, the edges drawn as loops on it: to itself, or between it and a
    /// composite it is in.
    loops: Vec<Vec<usize>>,
}

impl<'m> Layout<'m> {
    fn new(machine: &'m Machine) -> Self {
        let states = machine.states();
        // Lookups only: nothing iterates this map.
        let index: HashMap<&str, usize> = states.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
        let parents: Vec<Option<usize>> = states.iter().map(|s| s.parent.as_ref().map(|p| index[p.as_str()])).collect();
        let mut children = vec![Vec::new(); states.len()];
        let mut roots = Vec::new();
        for (i, p) in parents.iter().enumerate() {
            match p {
                Some(p) => children[*p].push(i),
                None => roots.push(i),
            }
        }
        let edges = edges::edges(machine);
        let ends: Vec<(usize, usize)> = edges.iter().map(|e| (index[e.from], index[e.to])).collect();
        let labels = edges.iter().map(|e| e.label.text(":")).collect();
        let mut loops = vec![Vec::new(); states.len()];
        for (i, e) in edges.iter().enumerate() {
            if e.from == e.to || machine.is_in(e.from, e.to) {
                loops[ends[i].0].push(i);
            } else if machine.is_in(e.to, e.from) {
                loops[ends[i].1].push(i);
            }
        }
        Layout { machine, edges, ends, labels, parents, children, roots, loops }
    }

    fn state(&self, i: usize) -> &'m State {
        &self.machine.states()[i]
    }

    fn is_loop(&self, edge: usize) -> bool {
        let (f, t) = self.ends[edge];
        self.loops[f].contains(&edge) || self.loops[t].contains(&edge)
    }

    /// Lays out the whole machine and draws its edges.
    fn diagram(&self) -> Diagram {
        let init = self.machine.initial_declared();
        let mut top = init.name.as_str();
        while let Some(p) = &self.machine.state(top).and_then(|s| s.parent.as_ref()) {
            top = p.as_str();
        }
        let first = self.roots.iter().position(|&r| self.state(r).name == top).unwrap_or(0);
        let mut group = self.group(&self.roots, first);
        group.shift(MARGIN, MARGIN);
        let mut rects = vec![Rect::default(); self.machine.states().len()];
        for (s, r) in &group.rects {
            rects[*s] = *r;
        }
        let mut paths: Vec<(String, Point)> = vec![(String::new(), Point::default()); self.edges.len()];
        for route in &group.routes {
            let (f, t) = self.ends[route.edge];
            let first = route.points.first().copied().unwrap_or(route.label);
            let last = route.points.last().copied().unwrap_or(route.label);
            let (stub_from, start, start_dir) = self.endpoint(f, route.from, first, &rects);
            let (stub_to, end, end_dir) = self.endpoint(t, route.to, last, &rects);
            let mut all = Vec::with_capacity(route.points.len() + 2);
            all.push(start);
            all.extend(route.points.iter().copied());
            all.push(end);
            let mut d = String::new();
            if let Some(p) = stub_from {
                let _ = write!(d, "M{},{} L{},{} ", num(p.x), num(p.y), num(start.x), num(start.y));
            }
            d.push_str(&curve(&all, start_dir, end_dir));
            if let Some(p) = stub_to {
                let _ = write!(d, " L{},{}", num(p.x), num(p.y));
            }
            paths[route.edge] = (d, route.label);
        }
        for (s, edges) in self.loops.iter().enumerate() {
            let r = rects[s];
            let head = if self.children[s].is_empty() { NODE_H } else { TITLE_H };
            let hy = r.y + head / 2.0;
            let n = edges.len() as f64;
            for (i, &e) in edges.iter().enumerate() {
                let ly = hy + (i as f64 - (n - 1.0) / 2.0) * (LABEL_H + 2.0);
                let ay = ly.clamp(r.y + 7.0, r.y + head - 7.0);
                let (x, c) = (r.right(), r.right() + LOOP_REACH * 4.0 / 3.0);
                let d = format!(
                    "M{},{} C{},{} {},{} {},{}",
                    num(x),
                    num(ay - 6.0),
                    num(c),
                    num(ly - 14.0),
                    num(c),
                    num(ly + 14.0),
                    num(x),
                    num(ay + 6.0)
                );
                let label = Point { x: x + LOOP_REACH + 4.0 + label_w(&self.labels[e]) / 2.0, y: ly };
                paths[e] = (d, label);
            }
        }
        Diagram { w: group.w + 2.0 * MARGIN, h: group.h + 2.0 * MARGIN, rects, paths, starts: group.starts }
    }

    /// Where an edge laid out between `member` and another member leaves or enters `s`,
    /// which is `member` or inside it, on its way to or from `toward`: the stub from `s`'s
    /// side to just outside `member`'s border, if `s` is inside `member` and the stub
    /// crosses no other state; the point where the curve starts or ends; and the curve's
    /// direction there.
    fn endpoint(&self, s: usize, member: usize, toward: Point, rects: &[Rect]) -> (Option<Point>, Point, Dir) {
        let r = rects[s];
        if s != member {
            let m = rects[member];
            let y = r.cy();
            let toward_right = toward.x >= m.cx();
            for right in [toward_right, !toward_right] {
                if right && !self.loops[s].is_empty() {
                    continue;
                }
                let (x0, x1) = if right { (r.right(), m.right() + STUB) } else { (r.x, m.x - STUB) };
                let (lo, hi) = (x0.min(x1), x0.max(x1));
                let blocked = rects.iter().enumerate().any(|(q, qr)| {
                    let reach = qr.right() + self.loop_extent(q).0;
                    q != s && !self.is_ancestor(q, s) && qr.y <= y && y <= qr.bottom() && qr.x < hi && reach > lo
                });
                if !blocked {
                    return (Some(Point { x: x0, y }), Point { x: x1, y }, Dir::Riser);
                }
            }
        }
        let (p, dir) = attach(r, toward);
        (None, p, dir)
    }

    /// Whether `a` is a (strict) ancestor of `s`.
    fn is_ancestor(&self, a: usize, mut s: usize) -> bool {
        while let Some(p) = self.parents[s] {
            if p == a {
                return true;
            }
            s = p;
        }
        false
    }

    /// The extra width right of a state's box its loops and their labels take, and the
    /// height their labels take.
    fn loop_extent(&self, s: usize) -> (f64, f64) {
        let loops = &self.loops[s];
        if loops.is_empty() {
            return (0.0, 0.0);
        }
        let widest = loops.iter().map(|&e| label_w(&self.labels[e])).fold(0.0, f64::max);
        (LOOP_REACH + 4.0 + widest + 2.0, loops.len() as f64 * (LABEL_H + 2.0))
    }

    /// Lays out `members`, siblings in declaration order, `members[initial]` first.
    fn group(&self, members: &[usize], initial: usize) -> Group {
        let n = members.len();
        let mut out = Group::default();

        // Each member's box, composites laid out first.
        let mut items: Vec<Item> = Vec::new();
        let mut boxes: Vec<(f64, f64)> = Vec::with_capacity(n);
        let mut inner: Vec<Option<Group>> = Vec::with_capacity(n);
        for &s in members {
            let state = self.state(s);
            let kids = &self.children[s];
            let (w, h, sub) = if kids.is_empty() {
                (text_w(&state.name) + 2.0 * NODE_PAD, NODE_H, None)
            } else {
                let first = state
                    .initial_child
                    .as_ref()
                    .and_then(|c| kids.iter().position(|&k| self.state(k).name == *c))
                    .unwrap_or(0);
                let sub = self.group(kids, first);
                let w = sub.w.max(text_w(&state.name) * 1.2) + 2.0 * BOX_PAD;
                (w, TITLE_H + sub.h + BOX_PAD, Some(sub))
            };
            let (extra, loops_h) = self.loop_extent(s);
            items.push(Item { kind: Kind::State, rank: 0, left: w / 2.0, right: w / 2.0 + extra, h: h.max(loops_h) });
            boxes.push((w, h));
            inner.push(sub);
        }

        // The edges between different members (an edge between states inside one member
        // is laid out inside it).
        let local: HashMap<usize, usize> = members.iter().enumerate().map(|(i, &s)| (s, i)).collect();
        let member_of = |mut s: usize| -> Option<usize> {
            loop {
                if let Some(&i) = local.get(&s) {
                    return Some(i);
                }
                s = self.parents[s]?;
            }
        };
        let links: Vec<Link> = (0..self.edges.len())
            .filter(|&e| !self.is_loop(e))
            .filter_map(|e| {
                let (from, to) = (member_of(self.ends[e].0)?, member_of(self.ends[e].1)?);
                (from != to).then_some(Link { edge: e, from, to })
            })
            .collect();

        // 1. Break cycles: a depth-first search from the initial member; its back edges
        // and the edges into the initial member point up.
        let mut out_links: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (k, l) in links.iter().enumerate() {
            out_links[l.from].push(k);
        }
        let mut mark = vec![0u8; n];
        let mut seen = Vec::with_capacity(n);
        let mut back = vec![false; links.len()];
        fn dfs(
            v: usize,
            out_links: &[Vec<usize>],
            links: &[Link],
            mark: &mut [u8],
            seen: &mut Vec<usize>,
            back: &mut [bool],
        ) {
            mark[v] = 1;
            seen.push(v);
            for &k in &out_links[v] {
                let w = links[k].to;
                match mark[w] {
                    0 => dfs(w, out_links, links, mark, seen, back),
                    1 => back[k] = true,
                    _ => {}
                }
            }
            mark[v] = 2;
        }
        for v in std::iter::once(initial).chain(0..n) {
            if mark[v] == 0 {
                dfs(v, &out_links, &links, &mut mark, &mut seen, &mut back);
            }
        }
        let reversed: Vec<bool> = links.iter().zip(&back).map(|(l, &b)| b || l.to == initial).collect();
        let dag: Vec<(usize, usize)> =
            links.iter().zip(&reversed).map(|(l, &r)| if r { (l.to, l.from) } else { (l.from, l.to) }).collect();

        // 2. Layers: the longest path from the sources. States take the even layers, edge
        // labels the odd ones between.
        let mut rank = vec![0usize; n];
        let mut indegree = vec![0usize; n];
        for &(_, b) in &dag {
            indegree[b] += 1;
        }
        let mut queue: VecDeque<usize> = (0..n).filter(|&v| indegree[v] == 0).collect();
        while let Some(v) = queue.pop_front() {
            for &(_, b) in dag.iter().filter(|(a, _)| *a == v) {
                rank[b] = rank[b].max(rank[v] + 2);
                indegree[b] -= 1;
                if indegree[b] == 0 {
                    queue.push_back(b);
                }
            }
        }
        for (item, &r) in items.iter_mut().zip(&rank) {
            item.rank = r;
        }
        // Each edge becomes a chain through the layers it crosses; its label sits in the
        // middle odd layer.
        let mut chains: Vec<Vec<usize>> = Vec::with_capacity(links.len());
        for (k, &(a, b)) in dag.iter().enumerate() {
            let (ra, rb) = (rank[a], rank[b]);
            debug_assert!(ra < rb, "layering follows the acyclic edges");
            let odd = (rb.saturating_sub(ra) / 2).max(1);
            let label_rank = ra + 1 + 2 * ((odd - 1) / 2);
            let mut chain = vec![a];
            for r in ra + 1..rb {
                chain.push(items.len());
                items.push(if r == label_rank {
                    let half = label_w(&self.labels[links[k].edge]) / 2.0;
                    Item { kind: Kind::Label, rank: r, left: half, right: half, h: LABEL_H }
                } else {
                    Item { kind: Kind::Dummy, rank: r, left: 0.0, right: 0.0, h: 0.0 }
                });
            }
            chain.push(b);
            chains.push(chain);
        }
        let m = items.len();
        let mut up: Vec<Vec<usize>> = vec![Vec::new(); m];
        let mut down: Vec<Vec<usize>> = vec![Vec::new(); m];
        for chain in &chains {
            for pair in chain.windows(2) {
                down[pair[0]].push(pair[1]);
                up[pair[1]].push(pair[0]);
            }
        }

        // 3. Order within layers: depth first from the members in search order, then
        // barycenter sweeps, keeping the order with the fewest crossings.
        let ranks = items.iter().map(|i| i.rank + 1).max().unwrap_or(1);
        let mut layers: Vec<Vec<usize>> = vec![Vec::new(); ranks];
        let mut placed = vec![false; m];
        fn visit(v: usize, items: &[Item], down: &[Vec<usize>], placed: &mut [bool], layers: &mut [Vec<usize>]) {
            if placed[v] {
                return;
            }
            placed[v] = true;
            layers[items[v].rank].push(v);
            for &w in &down[v] {
                visit(w, items, down, placed, layers);
            }
        }
        for v in seen.iter().copied().chain(0..m) {
            visit(v, &items, &down, &mut placed, &mut layers);
        }
        let mut best = layers.clone();
        let mut best_crossings = crossings(&layers, &down);
        for sweep in 0..ORDER_SWEEPS {
            let downward = sweep % 2 == 0;
            let order: Vec<usize> =
                if downward { (1..ranks).collect() } else { (0..ranks.saturating_sub(1)).rev().collect() };
            for r in order {
                let (neighbours, other) = if downward { (&up, r - 1) } else { (&down, r + 1) };
                let mut pos = vec![0.0; m];
                for (i, &v) in layers[other].iter().enumerate() {
                    pos[v] = i as f64;
                }
                let bary: Vec<(usize, f64)> = layers[r]
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let ns = &neighbours[v];
                        let b = if ns.is_empty() {
                            i as f64
                        } else {
                            ns.iter().map(|&w| pos[w]).sum::<f64>() / ns.len() as f64
                        };
                        (v, b)
                    })
                    .collect();
                let mut sorted = bary;
                sorted.sort_by(|a, b| a.1.total_cmp(&b.1));
                layers[r] = sorted.into_iter().map(|(v, _)| v).collect();
            }
            transpose(&mut layers, &up, &down);
            let c = crossings(&layers, &down);
            if c < best_crossings {
                best_crossings = c;
                best = layers.clone();
            }
        }
        let layers = best;

        // 4. Coordinates: pack each layer, then pull each node towards its neighbours.
        let gap = |a: usize, b: usize| {
            let g = if items[a].kind == Kind::State && items[b].kind == Kind::State { NODE_GAP } else { EDGE_GAP };
            items[a].right + g + items[b].left
        };
        let mut x = vec![0.0; m];
        for layer in &layers {
            for pair in layer.windows(2) {
                x[pair[1]] = x[pair[0]] + gap(pair[0], pair[1]);
            }
        }
        for sweep in 0..PLACE_SWEEPS {
            // Down, up, then both ways.
            let mode = if sweep + 2 >= PLACE_SWEEPS { 2 } else { sweep % 2 };
            let order: Vec<usize> = if mode == 1 { (0..ranks).rev().collect() } else { (0..ranks).collect() };
            for r in order {
                let layer = &layers[r];
                if layer.is_empty() {
                    continue;
                }
                let desired: Vec<f64> = layer
                    .iter()
                    .map(|&v| {
                        // An edge's nodes always sit between their two neighbours: long
                        // edges run straight.
                        let ns: Vec<usize> = match mode {
                            0 if items[v].kind == Kind::State => up[v].clone(),
                            1 if items[v].kind == Kind::State => down[v].clone(),
                            _ => up[v].iter().chain(&down[v]).copied().collect(),
                        };
                        if ns.is_empty() { x[v] } else { ns.iter().map(|&w| x[w]).sum::<f64>() / ns.len() as f64 }
                    })
                    .collect();
                let seps: Vec<f64> = layer.windows(2).map(|p| gap(p[0], p[1])).collect();
                for (v, xv) in layer.iter().zip(fit(&desired, &seps)) {
                    x[*v] = xv;
                }
            }
        }
        let min_x = (0..m).map(|v| x[v] - items[v].left).fold(f64::INFINITY, f64::min);
        let max_x = (0..m).map(|v| x[v] + items[v].right).fold(f64::NEG_INFINITY, f64::max);

        // Layers top to bottom, below the band of the initial marker; nodes centred.
        let mut centre_y = vec![0.0; ranks];
        let mut y = START_BAND;
        for (r, layer) in layers.iter().enumerate() {
            let h = layer.iter().map(|&v| items[v].h).fold(0.0, f64::max);
            centre_y[r] = y + h / 2.0;
            y += h + RANK_GAP;
        }
        out.w = max_x - min_x;
        out.h = y - RANK_GAP;
        let at = |v: usize| Point { x: x[v] - min_x, y: centre_y[items[v].rank] };

        for (i, ((&s, (w, h)), sub)) in members.iter().zip(boxes).zip(inner).enumerate() {
            let c = at(i);
            let rect = Rect { x: c.x - w / 2.0, y: c.y - h / 2.0, w, h };
            if let Some(mut sub) = sub {
                sub.shift(rect.x + BOX_PAD + (w - 2.0 * BOX_PAD - sub.w) / 2.0, rect.y + TITLE_H);
                out.absorb(sub);
            }
            out.rects.push((s, rect));
            if i == initial {
                out.starts.push((s, Point { x: rect.cx(), y: 8.0 }));
            }
        }
        for ((link, chain), &rev) in links.iter().zip(&chains).zip(&reversed) {
            let mut points: Vec<Point> = chain[1..chain.len() - 1].iter().map(|&v| at(v)).collect();
            let label = chain.iter().find(|&&v| items[v].kind == Kind::Label).map(|&v| at(v)).unwrap_or_default();
            if rev {
                points.reverse();
            }
            let (from, to) = (members[link.from], members[link.to]);
            out.routes.push(Route { edge: link.edge, from, to, points, label });
        }
        out
    }
}

/// The width of a state's name at 13px.
fn text_w(text: &str) -> f64 {
    text.chars().count() as f64 * CHAR_W
}

/// The width of an edge label's background at 11px.
fn label_w(text: &str) -> f64 {
    text.chars().count() as f64 * LABEL_CHAR_W + 2.0 * LABEL_PAD
}

mod order;
mod write;

#[cfg(test)]
mod tests;
