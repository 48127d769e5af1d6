use super::write::xml;
use super::*;
use crate::edges::Label;
use crate::fixtures;

/// An example machine from `examples/machines/`.
fn example(stem: &str, text: &str) -> Machine {
    crate::toml::load(&format!("{stem}.toml"), stem, text).unwrap_or_else(|r| panic!("{r}")).0
}

fn cluster() -> Machine {
    example("cluster", include_str!("../../../../examples/machines/cluster.toml"))
}

fn server_example() -> Machine {
    example("server", include_str!("../../../../examples/machines/server.toml"))
}

/// Every fixture and example: flat machines, statecharts, cycles and self-loops.
fn machines() -> Vec<Machine> {
    vec![
        fixtures::base().build().unwrap(),
        fixtures::server().build().unwrap(),
        fixtures::subscriber().build().unwrap(),
        fixtures::instance(),
        cluster(),
        example("replica", include_str!("../../../../examples/machines/replica.toml")),
        server_example(),
        example("logical_server", include_str!("../../../../examples/machines/logical_server.toml")),
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
        let expected: Vec<(&str, &str, &str, bool)> = edges::edges(&m)
            .iter()
            .map(|e| match e.label {
                Label::Auto(a) => (e.from, e.to, a, true),
                Label::Event(ev, _) => (e.from, e.to, ev, false),
            })
            .collect();
        assert_eq!(drawn, expected, "{}", m.name());
        for e in elements.iter().filter(|e| e.attr("data-from").is_some()) {
            let i = elements.iter().position(|x| std::ptr::eq(x, e)).unwrap();
            let kids: Vec<&str> = elements.iter().filter(|k| k.parent == Some(i)).map(|k| k.name.as_str()).collect();
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
