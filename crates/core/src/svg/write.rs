//! The SVG text of a laid out diagram: its groups, paths and labels, the style sheet, and
//! the curves and numbers they are written with.

use std::fmt::Write as _;

use super::{BOX_PAD, Diagram, Dir, LABEL_H, Layout, Point, Rect, label_w};
use crate::edges::{self, Label};
use crate::machine::{Health, StateKind};

impl Layout<'_> {
    /// The SVG text of a laid out diagram.
    pub(super) fn write(&self, d: &Diagram) -> String {
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
        let notes = edges::notes(self.machine, state, ":");
        if !notes.is_empty() {
            let _ = write!(out, "<title>{name}\n{}</title>", xml(&notes.join("\n")));
        }
        out.push_str("</g>\n");
    }
}

/// The embedded style sheet, every selector under `.settle-diagram`; `lit` and `visited`
/// are the classes the dashboard adds (the current state, the states and edges an entity
/// went through).
pub(super) fn style(arrow: &str) -> String {
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
        // The current state failing stays red: lit, in the error colours.
        ".settle-diagram .state.error.lit rect{fill:#fecaca;stroke:#b91c1c;stroke-width:3}",
        ".settle-diagram .state.error.lit text{fill:#7f1d1d;font-weight:600}",
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
pub(super) fn attach(r: Rect, toward: Point) -> (Point, Dir) {
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
pub(super) fn curve(points: &[Point], start: Dir, end: Dir) -> String {
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

/// A coordinate rounded to one decimal, without a trailing `.0` (and never `-0`).
pub(super) fn num(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r == r.trunc() { format!("{}", r as i64) } else { format!("{r:.1}") }
}

/// Text escaped for XML content and attribute values.
pub(super) fn xml(text: &str) -> String {
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
