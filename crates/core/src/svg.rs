//! Rendering a machine as an SVG image, laid out here (no Graphviz, no IO).
//!
//! The image draws [`crate::graph`]'s edges, labelled as in DOT (`auto: action`, `event
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

use crate::graph::{self, Label};
use crate::machine::{Health, Machine, State, StateKind};

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
    edges: Vec<graph::Edge<'m>>,
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
        let edges = graph::edges(machine);
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

    /// The SVG text of a laid out diagram.
    fn write(&self, d: &Diagram) -> String {
        let name = xml(self.machine.name());
        let id: String = self
            .machine
            .name()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        let arrow = format!("settle-arrow-{id}");
        let (w, h) = (num(d.w), num(d.h));
        let mut out = String::new();
        let _ = writeln!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"settle-diagram\" viewBox=\"0 0 {w} {h}\" \
             width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"state diagram of {name}\">"
        );
        let _ = writeln!(out, "<title>state diagram of {name}</title>");
        let _ = writeln!(out, "<style>\n{}</style>", style(&arrow));
        let _ = writeln!(out, "<defs>");
        for (suffix, fill) in [("", "#6b7280"), ("-visited", "#2563eb")] {
            let _ = writeln!(
                out,
                "<marker id=\"{arrow}{suffix}\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerUnits=\"userSpaceOnUse\" \
                 markerWidth=\"9\" markerHeight=\"9\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"{fill}\"/></marker>"
            );
        }
        let _ = writeln!(out, "</defs>");

        // Composites first, outer before inner, so that what is inside paints on top; then
        // the edges; then the leaves.
        let depth = |mut s: usize| {
            let mut d = 0;
            while let Some(p) = self.parents[s] {
                d += 1;
                s = p;
            }
            d
        };
        let mut composites: Vec<usize> = (0..self.children.len()).filter(|&s| !self.children[s].is_empty()).collect();
        composites.sort_by_key(|&s| (depth(s), s));
        for &s in &composites {
            self.write_state(&mut out, s, d.rects[s]);
        }
        for (e, edge) in self.edges.iter().enumerate() {
            let (path, label) = &d.paths[e];
            let (class, key) = match &edge.label {
                Label::Auto(action) => ("edge auto", *action),
                Label::Event(event, _) => ("edge", *event),
            };
            let text = &self.labels[e];
            let lw = label_w(text);
            let _ = writeln!(
                out,
                "<g class=\"{class}\" data-from=\"{}\" data-to=\"{}\" data-label=\"{}\"><path d=\"{path}\" \
                 marker-end=\"url(#{arrow})\"/><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"3\"/>\
                 <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text></g>",
                xml(edge.from),
                xml(edge.to),
                xml(key),
                num(label.x - lw / 2.0),
                num(label.y - LABEL_H / 2.0),
                num(lw),
                num(LABEL_H),
                num(label.x),
                num(label.y + 4.0),
                xml(text)
            );
        }
        for s in (0..self.children.len()).filter(|&s| self.children[s].is_empty()) {
            self.write_state(&mut out, s, d.rects[s]);
        }
        for (s, p) in &d.starts {
            let r = d.rects[*s];
            let _ = writeln!(
                out,
                "<g class=\"start\" data-initial=\"{}\"><circle cx=\"{}\" cy=\"{}\" r=\"5\"/><path d=\"M{},{} L{},{}\" \
                 marker-end=\"url(#{arrow})\"/></g>",
                xml(&self.state(*s).name),
                num(p.x),
                num(p.y),
                num(p.x),
                num(p.y + 5.0),
                num(p.x),
                num(r.y)
            );
        }
        out.push_str("</svg>\n");
        out
    }

    fn write_state(&self, out: &mut String, s: usize, r: Rect) {
        let state = self.state(s);
        let composite = !self.children[s].is_empty();
        let terminal = matches!(state.kind, StateKind::Terminal | StateKind::Deleted);
        let mut class = String::from("state");
        for (on, c) in [
            (composite, " composite"),
            (terminal, " terminal"),
            (!state.at_rest(), " unstable"),
            (state.health == Health::Error, " error"),
        ] {
            if on {
                class.push_str(c);
            }
        }
        let name = xml(&state.name);
        let _ = write!(out, "<g class=\"{class}\" data-state=\"{name}\"");
        if let Some(p) = &state.parent {
            let _ = write!(out, " data-parent=\"{}\"", xml(p));
        }
        let rx = if composite { 8.0 } else { 6.0 };
        let _ = write!(
            out,
            "><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"{rx}\"/>",
            num(r.x),
            num(r.y),
            num(r.w),
            num(r.h)
        );
        if terminal {
            let _ = write!(
                out,
                "<rect class=\"inner\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"4\"/>",
                num(r.x + 3.0),
                num(r.y + 3.0),
                num(r.w - 6.0),
                num(r.h - 6.0)
            );
        }
        if composite {
            let _ = write!(out, "<text x=\"{}\" y=\"{}\">{name}</text>", num(r.x + BOX_PAD), num(r.y + 18.0));
        } else {
            let _ = write!(
                out,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{name}</text>",
                num(r.cx()),
                num(r.cy() + 4.5)
            );
        }
        let notes = graph::notes(self.machine, state, ":");
        if !notes.is_empty() {
            let _ = write!(out, "<title>{name}\n{}</title>", xml(&notes.join("\n")));
        }
        out.push_str("</g>\n");
    }
}

/// The embedded style sheet, every selector under `.settle-diagram`; `lit` and `visited`
/// are the classes the dashboard adds (the current state, the states and edges an entity
/// went through).
fn style(arrow: &str) -> String {
    let rules = [
        ".settle-diagram{font-family:system-ui,-apple-system,\"Segoe UI\",Roboto,sans-serif}",
        ".settle-diagram text{font-size:13px;fill:#1f2937}",
        ".settle-diagram .state rect{fill:#fff;stroke:#4b5563;stroke-width:1.2}",
        ".settle-diagram .state rect.inner{fill:none}",
        ".settle-diagram .state.composite rect{fill:#f5f6f8;stroke:#9ca3af}",
        ".settle-diagram .state.composite text{font-weight:600}",
        ".settle-diagram .state.unstable rect{stroke-dasharray:5 3}",
        ".settle-diagram .state.error rect{fill:#fef2f2;stroke:#c53030}",
        ".settle-diagram .state.error text{fill:#9b2c2c}",
        ".settle-diagram .edge path{fill:none;stroke:#6b7280;stroke-width:1.3}",
        ".settle-diagram .edge rect{fill:#fff;fill-opacity:0.9;stroke:none}",
        ".settle-diagram .edge text{font-size:11px;fill:#374151}",
        ".settle-diagram .edge.auto text{font-style:italic}",
        ".settle-diagram .start circle{fill:#1f2937}",
        ".settle-diagram .start path{fill:none;stroke:#1f2937;stroke-width:1.3}",
        ".settle-diagram .state.visited rect{fill:#e8f0fe;stroke:#60a5fa;stroke-width:1.8}",
        ".settle-diagram .state.composite.visited rect{fill:#f3f7ff}",
        ".settle-diagram .state.lit rect{fill:#bfdbfe;stroke:#1d4ed8;stroke-width:3}",
        ".settle-diagram .state.composite.lit rect{fill:#eef4ff}",
        ".settle-diagram .state.lit text{fill:#1e3a8a;font-weight:600}",
    ];
    let mut out = String::new();
    for r in rules {
        out.push_str(r);
        out.push('\n');
    }
    let _ = writeln!(
        out,
        ".settle-diagram .edge.visited path{{stroke:#2563eb;stroke-width:2;marker-end:url(#{arrow}-visited)}}"
    );
    out.push_str(".settle-diagram .edge.visited text{fill:#1d4ed8}\n");
    out
}

/// Where an edge leaves or enters `r` on its way to or from `toward`: the bottom or top
/// side when `toward` is below or above it, else the left or right side, as near to
/// `toward` as the rounded corners allow; and the direction it leaves or enters.
fn attach(r: Rect, toward: Point) -> (Point, Dir) {
    let inset = 10.0_f64.min(r.w / 2.0);
    let along_x = toward.x.clamp(r.x + inset, r.right() - inset);
    if toward.y >= r.bottom() {
        (Point { x: along_x, y: r.bottom() }, Dir::Vertical)
    } else if toward.y <= r.y {
        (Point { x: along_x, y: r.y }, Dir::Vertical)
    } else {
        let inset = 6.0_f64.min(r.h / 2.0);
        let y = toward.y.clamp(r.y + inset, r.bottom() - inset);
        (Point { x: if toward.x >= r.cx() { r.right() } else { r.x }, y }, Dir::Horizontal)
    }
}

/// A smooth path through `points` (a Catmull-Rom spline as cubic curves), leaving the
/// first and entering the last in the given directions.
fn curve(points: &[Point], start: Dir, end: Dir) -> String {
    let mut d = String::new();
    let Some(first) = points.first() else { return d };
    let _ = write!(d, "M{},{}", num(first.x), num(first.y));
    let n = points.len();
    let towards = |p: Point, q: Point, dir: Dir| match dir {
        Dir::Vertical => Point { x: p.x, y: p.y + (q.y - p.y) / 2.0 },
        Dir::Horizontal => Point { x: p.x + (q.x - p.x) / 2.0, y: p.y },
        Dir::Riser => Point { x: p.x, y: p.y + (q.y - p.y) * 0.9 },
    };
    // The tangent at an inner point, a third of it.
    let tangent =
        |i: usize| Point { x: (points[i + 1].x - points[i - 1].x) / 6.0, y: (points[i + 1].y - points[i - 1].y) / 6.0 };
    for i in 0..n - 1 {
        let (p, q) = (points[i], points[i + 1]);
        let c1 = if i == 0 {
            towards(p, q, start)
        } else {
            let t = tangent(i);
            Point { x: p.x + t.x, y: p.y + t.y }
        };
        let c2 = if i + 2 == n {
            towards(q, p, end)
        } else {
            let t = tangent(i + 1);
            Point { x: q.x - t.x, y: q.y - t.y }
        };
        let straight = [c1.x, c2.x, q.x].iter().all(|x| (x - p.x).abs() < 0.05)
            || [c1.y, c2.y, q.y].iter().all(|y| (y - p.y).abs() < 0.05);
        if straight {
            let _ = write!(d, " L{},{}", num(q.x), num(q.y));
        } else {
            let _ = write!(d, " C{},{} {},{} {},{}", num(c1.x), num(c1.y), num(c2.x), num(c2.y), num(q.x), num(q.y));
        }
    }
    d
}

/// Positions as near as possible to `desired` (least squares), in order, each at least
/// `seps[i]` after the one before: pool-adjacent-violators on the positions less their
/// minimal offsets.
fn fit(desired: &[f64], seps: &[f64]) -> Vec<f64> {
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
fn transpose(layers: &mut [Vec<usize>], up: &[Vec<usize>], down: &[Vec<usize>]) {
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
fn crossings(layers: &[Vec<usize>], down: &[Vec<usize>]) -> usize {
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

/// The width of a state's name at 13px.
fn text_w(text: &str) -> f64 {
    text.chars().count() as f64 * CHAR_W
}

/// The width of an edge label's background at 11px.
fn label_w(text: &str) -> f64 {
    text.chars().count() as f64 * LABEL_CHAR_W + 2.0 * LABEL_PAD
}

/// A coordinate rounded to one decimal, without a trailing `.0` (and never `-0`).
fn num(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r == r.trunc() { format!("{}", r as i64) } else { format!("{r:.1}") }
}

/// Text escaped for XML content and attribute values.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    /// An example machine from `examples/machines/`.
    fn example(stem: &str, text: &str) -> Machine {
        crate::toml::load(&format!("{stem}.toml"), stem, text).unwrap_or_else(|r| panic!("{r}")).0
    }

    fn cluster() -> Machine {
        example("cluster", include_str!("../../../examples/machines/cluster.toml"))
    }

    fn server_example() -> Machine {
        example("server", include_str!("../../../examples/machines/server.toml"))
    }

    /// Every fixture and example: flat machines, statecharts, cycles and self-loops.
    fn machines() -> Vec<Machine> {
        vec![
            fixtures::base().build().unwrap(),
            fixtures::server().build().unwrap(),
            fixtures::subscriber().build().unwrap(),
            fixtures::instance(),
            cluster(),
            example("replica", include_str!("../../../examples/machines/replica.toml")),
            server_example(),
            example("logical_server", include_str!("../../../examples/machines/logical_server.toml")),
        ]
    }

    /// An element of a parsed document.
    #[derive(Debug)]
    struct Element {
        name: String,
        attrs: Vec<(String, String)>,
        parent: Option<usize>,
        text: String,
    }

    impl Element {
        fn attr(&self, name: &str) -> Option<&str> {
            self.attrs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
        }
        fn num(&self, name: &str) -> f64 {
            self.attr(name).unwrap_or_else(|| panic!("{} has no {name}", self.name)).parse().unwrap()
        }
    }

    /// Checks that every `&` starts one of the five XML entities, and resolves them.
    fn unescape(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(i) = rest.find('&') {
            out.push_str(&rest[..i]);
            let after = &rest[i..];
            let (entity, c) = [("&amp;", '&'), ("&lt;", '<'), ("&gt;", '>'), ("&quot;", '"'), ("&apos;", '\'')]
                .into_iter()
                .find(|(e, _)| after.starts_with(e))
                .unwrap_or_else(|| panic!("bare `&` in {text:?}"));
            out.push(c);
            rest = &after[entity.len()..];
        }
        out.push_str(rest);
        out
    }

    /// A tiny XML checker: balanced tags, quoted attributes without `<` or a bare `&`,
    /// no attribute twice, one root. Panics on anything else; returns the elements in
    /// document order.
    fn parse(xml: &str) -> Vec<Element> {
        let mut elements: Vec<Element> = Vec::new();
        let mut stack: Vec<usize> = Vec::new();
        let mut rest = xml;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("</") {
                let end = after.find('>').expect("closing tag ends");
                let open = stack.pop().unwrap_or_else(|| panic!("`</{}>` closes nothing", &after[..end]));
                assert_eq!(elements[open].name, &after[..end], "tags balance");
                rest = &after[end + 1..];
            } else if let Some(after) = rest.strip_prefix('<') {
                let end = after.find('>').expect("tag ends");
                let (mut tag, empty) = match after[..end].strip_suffix('/') {
                    Some(t) => (t, true),
                    None => (&after[..end], false),
                };
                let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
                let name = tag[..name_end].to_string();
                assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric()), "tag name {name:?}");
                tag = tag[name_end..].trim_start();
                let mut attrs: Vec<(String, String)> = Vec::new();
                while !tag.is_empty() {
                    let eq = tag.find("=\"").unwrap_or_else(|| panic!("attribute in {tag:?}"));
                    let attr = tag[..eq].to_string();
                    assert!(attr.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "attribute name {attr:?}");
                    let value_end = tag[eq + 2..].find('"').expect("attribute value ends");
                    let raw = &tag[eq + 2..eq + 2 + value_end];
                    assert!(!raw.contains('<'), "`<` in attribute {raw:?}");
                    assert!(attrs.iter().all(|(a, _)| *a != attr), "{attr} twice");
                    attrs.push((attr, unescape(raw)));
                    tag = tag[eq + 2 + value_end + 1..].trim_start();
                }
                let parent = stack.last().copied();
                assert!(parent.is_some() || elements.is_empty(), "one root");
                elements.push(Element { name, attrs, parent, text: String::new() });
                if !empty {
                    stack.push(elements.len() - 1);
                }
                rest = &after[end + 1..];
            } else {
                let end = rest.find('<').unwrap_or(rest.len());
                let text = unescape(&rest[..end]);
                match stack.last() {
                    Some(&open) => elements[open].text.push_str(&text),
                    None => assert!(text.trim().is_empty(), "text outside the root: {text:?}"),
                }
                rest = &rest[end..];
            }
        }
        assert!(stack.is_empty(), "unclosed tags");
        elements
    }

    /// Each state's box as drawn, by name: the first `<rect>` of its group.
    fn boxes(elements: &[Element]) -> Vec<(String, Option<String>, Rect)> {
        elements
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let state = e.attr("data-state")?;
                let rect = elements.iter().find(|r| r.parent == Some(i) && r.name == "rect").expect("a state's rect");
                let r = Rect { x: rect.num("x"), y: rect.num("y"), w: rect.num("width"), h: rect.num("height") };
                Some((state.to_string(), e.attr("data-parent").map(str::to_string), r))
            })
            .collect()
    }

    fn inside(inner: Rect, outer: Rect) -> bool {
        inner.x >= outer.x && inner.y >= outer.y && inner.right() <= outer.right() && inner.bottom() <= outer.bottom()
    }

    fn overlap(a: Rect, b: Rect) -> bool {
        a.x < b.right() && b.x < a.right() && a.y < b.bottom() && b.y < a.bottom()
    }

    #[test]
    fn every_state_appears_once() {
        for m in machines() {
            let elements = parse(&render(&m));
            let drawn: Vec<&str> = elements.iter().filter_map(|e| e.attr("data-state")).collect();
            for s in m.states() {
                assert_eq!(drawn.iter().filter(|&&d| d == s.name.as_str()).count(), 1, "{} in {}", s.name, m.name());
            }
            assert_eq!(drawn.len(), m.states().len());
        }
    }

    #[test]
    fn one_edge_group_per_graph_edge() {
        for m in machines() {
            let elements = parse(&render(&m));
            let drawn: Vec<(&str, &str, &str, bool)> = elements
                .iter()
                .filter(|e| e.name == "g" && e.attr("class").is_some_and(|c| c.split(' ').any(|c| c == "edge")))
                .map(|e| {
                    let auto = e.attr("class").unwrap().split(' ').any(|c| c == "auto");
                    (e.attr("data-from").unwrap(), e.attr("data-to").unwrap(), e.attr("data-label").unwrap(), auto)
                })
                .collect();
            let expected: Vec<(&str, &str, &str, bool)> = graph::edges(&m)
                .iter()
                .map(|e| match e.label {
                    Label::Auto(a) => (e.from, e.to, a, true),
                    Label::Event(ev, _) => (e.from, e.to, ev, false),
                })
                .collect();
            assert_eq!(drawn, expected, "{}", m.name());
            for e in elements.iter().filter(|e| e.attr("data-from").is_some()) {
                let i = elements.iter().position(|x| std::ptr::eq(x, e)).unwrap();
                let kids: Vec<&str> =
                    elements.iter().filter(|k| k.parent == Some(i)).map(|k| k.name.as_str()).collect();
                assert_eq!(kids, ["path", "rect", "text"]);
            }
        }
    }

    #[test]
    fn output_is_deterministic() {
        for m in machines() {
            let first = render(&m);
            assert_eq!(first, render(&m));
            assert_eq!(first, render(&m.clone()), "{}", m.name());
        }
    }

    #[test]
    fn output_is_well_formed_and_follows_the_contract() {
        for m in machines() {
            let text = render(&m);
            assert!(text.ends_with("</svg>\n"));
            let elements = parse(&text);
            let root = &elements[0];
            assert_eq!(root.name, "svg");
            assert_eq!(root.attr("xmlns"), Some("http://www.w3.org/2000/svg"));
            assert_eq!(root.attr("class"), Some("settle-diagram"));
            assert_eq!(root.attr("role"), Some("img"));
            let label = format!("state diagram of {}", m.name());
            assert_eq!(root.attr("aria-label"), Some(label.as_str()));
            let (w, h) = (root.num("width"), root.num("height"));
            assert_eq!(root.attr("viewBox"), Some(format!("0 0 {} {}", num(w), num(h)).as_str()));
            assert!(elements.iter().any(|e| e.name == "title" && e.parent == Some(0) && e.text == label));
            // Every state group is a child of the root, and every rule is scoped.
            for e in elements.iter().filter(|e| e.attr("data-state").is_some()) {
                assert_eq!(e.parent, Some(0));
            }
            let style = elements.iter().find(|e| e.name == "style").expect("a style sheet");
            for rule in style.text.lines().filter(|l| !l.is_empty()) {
                let selectors = &rule[..rule.find('{').unwrap()];
                assert!(selectors.split(',').all(|s| s.starts_with(".settle-diagram")), "{rule}");
            }
            for class in [".state.lit rect", ".state.visited rect", ".edge.visited path"] {
                assert!(style.text.contains(&format!(".settle-diagram {class}{{")), "{class}");
            }
            // Everything drawn lies within the image.
            for (_, _, r) in boxes(&elements) {
                assert!(inside(r, Rect { x: 0.0, y: 0.0, w, h }), "{r:?} outside {w}x{h} in {}", m.name());
            }
        }
    }

    #[test]
    fn names_are_escaped() {
        assert_eq!(xml(r#"a&b<c>d"e'f"#), "a&amp;b&lt;c&gt;d&quot;e&apos;f");
        assert_eq!(unescape(&xml(r#"<&'">"#)), r#"<&'">"#);
        assert_eq!(
            (num(1.04), num(-0.04), num(2.25), num(-3.5), num(12.0)),
            ("1".into(), "0".into(), "2.3".into(), "-3.5".into(), "12".into())
        );
    }

    /// Statecharts: children inside their parent's box, siblings apart, each child
    /// marked with its parent.
    #[test]
    fn children_lie_inside_their_parents_and_siblings_apart() {
        for m in machines() {
            let drawn = boxes(&parse(&render(&m)));
            let rect = |name: &str| drawn.iter().find(|(n, _, _)| n == name).unwrap().2;
            for (name, parent, r) in &drawn {
                let declared = m.state(name).unwrap().parent.as_ref().map(|p| p.to_string());
                assert_eq!(parent, &declared, "{name} in {}", m.name());
                if let Some(p) = parent {
                    assert!(inside(*r, rect(p)), "{name} {r:?} outside {p} {:?} in {}", rect(p), m.name());
                }
            }
            for (i, (a, pa, ra)) in drawn.iter().enumerate() {
                for (b, pb, rb) in &drawn[i + 1..] {
                    if pa == pb {
                        assert!(!overlap(*ra, *rb), "{a} {ra:?} overlaps {b} {rb:?} in {}", m.name());
                    }
                }
            }
        }
    }

    /// `idle` and `busy` form a cycle, and `busy`'s auto action loops back to it.
    #[test]
    fn cycles_and_self_loops_render() {
        let m = fixtures::base().build().unwrap();
        let text = render(&m);
        assert!(text.contains("<g class=\"edge auto\" data-from=\"busy\" data-to=\"busy\" data-label=\"work\">"));
        assert!(text.contains("<g class=\"edge auto\" data-from=\"busy\" data-to=\"idle\" data-label=\"work\">"));
        assert!(text.contains("<g class=\"edge\" data-from=\"idle\" data-to=\"busy\" data-label=\"go\">"));
        let drawn = boxes(&parse(&text));
        let (idle, busy) = (drawn[0].2, drawn[1].2);
        assert!(idle.bottom() < busy.y, "the initial state is above the other");
        // The composite's classes, and the edge from a composite to its own substate.
        let text = render(&fixtures::instance());
        assert!(text.contains("<g class=\"state composite\" data-state=\"active\">"));
        assert!(text.contains("<g class=\"state unstable\" data-state=\"starting\" data-parent=\"active\">"));
        assert!(text.contains("<g class=\"state terminal\" data-state=\"gone\">"));
        assert!(text.contains("data-from=\"active\" data-to=\"starting\" data-label=\"restart\""));
        assert!(text.contains("<g class=\"start\" data-initial=\"starting\">"));
    }

    /// The example server: its initial state alone on the first layer, at the top, with
    /// the initial marker pointing at it; failed is drawn as an error state.
    #[test]
    fn server_example_starts_at_the_top() {
        let m = server_example();
        let text = render(&m);
        let drawn = boxes(&parse(&text));
        let new = drawn.iter().find(|(n, _, _)| n == "new").unwrap().2;
        for (name, _, r) in &drawn {
            if name != "new" {
                assert!(r.y >= new.bottom(), "{name} is below new");
            }
        }
        assert!(text.contains("<g class=\"start\" data-initial=\"new\">"));
        assert!(text.contains("<g class=\"state unstable error\" data-state=\"failed\">"));
        assert!(text.contains("<g class=\"state terminal\" data-state=\"gone\">"));
    }

    #[test]
    fn examples_stay_narrow() {
        for m in machines() {
            let root = &parse(&render(&m))[0];
            assert!(root.num("width") <= 1400.0, "{} is {} wide", m.name(), root.num("width"));
        }
    }

    #[test]
    fn fit_keeps_order_and_spacing() {
        assert_eq!(fit(&[0.0, 0.0, 0.0], &[10.0, 10.0]), [-10.0, 0.0, 10.0]);
        assert_eq!(fit(&[0.0, 50.0], &[10.0]), [0.0, 50.0]);
        assert_eq!(fit(&[5.0], &[]), [5.0]);
    }

    /// A random machine: `parents[i]` nests state `i` in an earlier state (or not), each
    /// link is an event from one state to another (or itself).
    fn random_machine(parents: &[Option<usize>], links: &[(usize, usize)]) -> Machine {
        let n = parents.len();
        let mut b = crate::MachineBuilder::new("random");
        for i in 0..n {
            b = b.state(format!("s{i}"));
            if i == 0 {
                b = b.initial();
            }
            if let Some(p) = parents[i] {
                b = b.parent(format!("s{p}"));
            }
            if let Some(child) = (i + 1..n).find(|&c| parents[c] == Some(i)) {
                b = b.initial_child(format!("s{child}"));
            }
        }
        for (k, &(f, t)) in links.iter().enumerate() {
            b = b.event(format!("e{k}"), [format!("s{}", f % n)], format!("a{k}"));
            b = b.action(format!("a{k}"), [format!("s{}", t % n)]);
        }
        b.build().unwrap_or_else(|r| panic!("{r}"))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 200, failure_persistence: None, ..Default::default()
        })]

        /// Any statechart renders: well formed, each state once, children inside their
        /// parents, siblings apart.
        #[test]
        fn random_statecharts_render(
            nesting in proptest::collection::vec(proptest::option::weighted(0.4, 0usize..100), 1..14),
            links in proptest::collection::vec((0usize..100, 0usize..100), 0..30),
        ) {
            // State 0 is a root; any other state may be nested in an earlier one.
            let parents: Vec<Option<usize>> =
                nesting.iter().enumerate().map(|(i, p)| if i == 0 { None } else { p.map(|p| p % i) }).collect();
            let m = random_machine(&parents, &links);
            let text = render(&m);
            let drawn = boxes(&parse(&text));
            proptest::prop_assert_eq!(drawn.len(), m.states().len());
            let rect = |name: &str| drawn.iter().find(|(n, _, _)| n == name).unwrap().2;
            for (i, (a, pa, ra)) in drawn.iter().enumerate() {
                if let Some(p) = pa {
                    proptest::prop_assert!(inside(*ra, rect(p)), "{} outside {}", a, p);
                }
                for (b, pb, rb) in &drawn[i + 1..] {
                    proptest::prop_assert!(pa != pb || !overlap(*ra, *rb), "{} overlaps {}", a, b);
                }
            }
            proptest::prop_assert_eq!(text, render(&m));
        }
    }
}
