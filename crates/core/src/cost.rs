//! What an expression may cost, checked before it runs: its length, how deep it nests (a
//! chain of operators or field selections nests as deep as it is long), how many terms it
//! has, how long its list and map literals are, how far comprehensions (`all`, `exists`,
//! `map`, …) nest, and, in a request, whether a comprehension builds a list (`map`,
//! `filter`). The `cel` crate parses and evaluates recursively, so an expression too deep
//! would overflow a thread's stack; these checks are themselves free of recursion.
//!
//! Two passes: [`check_source`] reads the text before it is parsed (a bound on the depth
//! the parser will meet, from brackets and operators), and [`check_tree`] walks the
//! parsed tree with an explicit stack (the exact depth, terms, literals, comprehensions).
//! [`Limits::REQUEST`] bounds what a request may ask (`where`, a bulk filter);
//! [`Limits::DEFINITION`] what a machine's definition may hold (guards, declarative
//! actions), checked when it is loaded.

use cel::common::ast::{EntryExpr, Expr, IdedExpr};

/// The bounds an expression must keep. Every message that refuses one names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest source text, in bytes.
    pub length: usize,
    /// Deepest nesting: brackets, and each operator or selection in a chain, count one.
    pub depth: usize,
    /// Most terms (nodes of the parsed tree, macros expanded).
    pub terms: usize,
    /// Longest list or map literal.
    pub literal: usize,
    /// How many comprehensions may nest (1: none inside another).
    pub comprehensions: usize,
    /// Whether a comprehension may build a list (`map`, `filter`): its result grows with
    /// its range, and one inside another multiplies.
    pub building: bool,
}

impl Limits {
    /// What a request may ask: a filter over entities, evaluated once per entity a page
    /// examines.
    pub const REQUEST: Limits =
        Limits { length: 1024, depth: 48, terms: 256, literal: 64, comprehensions: 1, building: false };
    /// What a machine's definition may hold.
    pub const DEFINITION: Limits =
        Limits { length: 4096, depth: 64, terms: 1024, literal: 256, comprehensions: 2, building: true };
}

/// Checks `source` before it is parsed, without recursion: its length, and a bound on the
/// depth its parse tree will have (each open bracket, and each operator or `.` chained at
/// one bracket level, one more). `Err` names the limit.
pub fn check_source(source: &str, limits: &Limits) -> Result<(), String> {
    if source.len() > limits.length {
        return Err(format!("the expression is {} bytes long; at most {} are allowed", source.len(), limits.length));
    }
    // Per open bracket: how many operators were chained at its level so far.
    let mut levels: Vec<usize> = vec![0];
    let mut depth = 1usize;
    let mut deepest = depth;
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' => skip_string(c, &mut chars),
            '(' | '[' | '{' => {
                levels.push(0);
                depth += 1;
            }
            ')' | ']' | '}' if levels.len() > 1 => depth -= 1 + levels.pop().unwrap_or(0),
            ',' | ':' => {
                // A new argument, element or branch starts its own chain.
                if let Some(ops) = levels.last_mut() {
                    depth -= *ops;
                    *ops = 0;
                }
            }
            '.' if chars.peek().is_some_and(char::is_ascii_digit) => {}
            '.' | '+' | '-' | '*' | '/' | '%' | '<' | '>' | '=' | '!' | '&' | '|' | '?' => {
                // `==`, `<=`, `&&`, … are one operator.
                let pair = matches!(c, '=' | '&' | '|') || (matches!(c, '<' | '>' | '!') && chars.peek() == Some(&'='));
                if pair && (chars.peek() == Some(&c) || chars.peek() == Some(&'=')) {
                    chars.next();
                }
                if let Some(ops) = levels.last_mut() {
                    *ops += 1;
                }
                depth += 1;
            }
            _ => {}
        }
        deepest = deepest.max(depth);
        if deepest > limits.depth {
            return Err(too_deep(limits));
        }
    }
    Ok(())
}

/// Skips a string literal opened by `quote` (single, or triple `'''`/`"""`), escapes
/// included.
fn skip_string(quote: char, chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    let triple = {
        let mut ahead = chars.clone();
        ahead.next() == Some(quote) && ahead.next() == Some(quote)
    };
    if triple {
        chars.next();
        chars.next();
    }
    let mut run = 0;
    while let Some(c) = chars.next() {
        if c == '\\' {
            chars.next();
            run = 0;
            continue;
        }
        if c == quote {
            run += 1;
            if !triple || run == 3 {
                return;
            }
        } else {
            run = 0;
        }
    }
}

fn too_deep(limits: &Limits) -> String {
    format!(
        "the expression nests deeper than {} levels (each bracket, and each operator or `.` in a chain, is one)",
        limits.depth
    )
}

/// Checks a parsed tree with an explicit stack: its depth, terms, literals and
/// comprehensions. `Err` names the limit.
pub fn check_tree(root: &IdedExpr, limits: &Limits) -> Result<(), String> {
    // (node, its depth, comprehensions around it)
    let mut stack: Vec<(&IdedExpr, usize, usize)> = vec![(root, 1, 0)];
    let mut terms = 0usize;
    while let Some((node, depth, around)) = stack.pop() {
        terms += 1;
        if terms > limits.terms {
            return Err(format!("the expression has more than {} terms", limits.terms));
        }
        if depth > limits.depth {
            return Err(too_deep(limits));
        }
        let below = depth + 1;
        match &node.expr {
            Expr::Call(call) => {
                stack.extend(call.target.as_deref().map(|t| (t, below, around)));
                stack.extend(call.args.iter().map(|a| (a, below, around)));
            }
            Expr::Select(select) => stack.push((&select.operand, below, around)),
            Expr::List(list) => {
                if list.elements.len() > limits.literal {
                    return Err(literal(list.elements.len(), "list", limits));
                }
                stack.extend(list.elements.iter().map(|e| (e, below, around)));
            }
            Expr::Map(map) => {
                if map.entries.len() > limits.literal {
                    return Err(literal(map.entries.len(), "map", limits));
                }
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(m) = &entry.expr {
                        stack.push((&m.key, below, around));
                        stack.push((&m.value, below, around));
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        stack.push((&f.value, below, around));
                    }
                }
            }
            Expr::Comprehension(c) => {
                let inside = around + 1;
                if inside > limits.comprehensions {
                    return Err(if limits.comprehensions == 1 {
                        "a comprehension (`all`, `exists`, `exists_one`, `map`, `filter`) may not contain another"
                            .to_string()
                    } else {
                        format!(
                            "comprehensions (`all`, `exists`, `map`, …) nest more than {} deep",
                            limits.comprehensions
                        )
                    });
                }
                if !limits.building && matches!(c.accu_init.expr, Expr::List(_) | Expr::Map(_)) {
                    return Err("a request's expression may not build a list (`map`, `filter`): use `all`, `exists` \
                                or `exists_one`"
                        .to_string());
                }
                stack.push((&c.iter_range, below, around));
                for part in [&c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                    stack.push((part, below, inside));
                }
            }
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
    Ok(())
}

fn literal(n: usize, what: &str, limits: &Limits) -> String {
    format!("a {what} literal of {n} items; at most {} are allowed", limits.literal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(source: &str) -> cel::Program {
        cel::Program::compile(source).unwrap()
    }

    #[test]
    fn a_long_chain_is_refused_before_it_is_parsed() {
        let select = format!("props{} == 1", ".a".repeat(5000));
        let sum = format!("{} > 0", vec!["1"; 1500].join(" + "));
        let nots = format!("{}true", "!".repeat(5000));
        for source in [&select, &sum, &nots] {
            let err = check_source(source, &Limits { length: 1 << 20, ..Limits::REQUEST }).unwrap_err();
            assert!(err.contains("deeper than 48 levels"), "{err}");
        }
        let err = check_source(&select, &Limits::REQUEST).unwrap_err();
        assert!(err.contains("10010 bytes long; at most 1024"), "{err}");
        let nested = format!("{}1{}", "(".repeat(60), ")".repeat(60));
        assert!(check_source(&nested, &Limits::REQUEST).unwrap_err().contains("deeper than 48"));
    }

    #[test]
    fn ordinary_filters_pass_both_checks() {
        for source in [
            r#"props.region == "eu" && props.cpus >= 4"#,
            "in_state('up') || (has(props.n) && props.n > 3 && props.n < 10)",
            r#"props.tags.exists(t, t == "gpu") && !("x" in props.tags)"#,
            "[1, 2, 3].all(x, x > 0)",
            "props.a.b.c.d.e == 'f.g(h)' && props.s.startsWith('a,b:c')",
            r#"'''a "quoted" ((((((''' == props.s"#,
        ] {
            check_source(source, &Limits::REQUEST).unwrap_or_else(|e| panic!("{source}: {e}"));
            check_tree(parsed(source).expression(), &Limits::REQUEST).unwrap_or_else(|e| panic!("{source}: {e}"));
        }
    }

    #[test]
    fn strings_do_not_count_as_structure() {
        let quoted = format!("props.s == \"{}\"", "(+.".repeat(200));
        check_source(&quoted, &Limits::REQUEST).unwrap();
        let escaped = format!("props.s == \"\\\"{}\"", "(".repeat(200));
        check_source(&escaped, &Limits::REQUEST).unwrap();
    }

    #[test]
    fn nested_comprehensions_list_building_and_large_literals_are_refused_in_requests() {
        let list = format!("[{}]", (0..40).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
        let nested = format!("{list}.all(a, {list}.all(b, a >= b))");
        let err = check_tree(parsed(&nested).expression(), &Limits::REQUEST).unwrap_err();
        assert!(err.contains("may not contain another"), "{err}");
        check_tree(parsed(&nested).expression(), &Limits::DEFINITION).unwrap();
        let map = format!("size({list}.map(a, a)) > 0");
        let err = check_tree(parsed(&map).expression(), &Limits::REQUEST).unwrap_err();
        assert!(err.contains("may not build a list"), "{err}");
        let big = format!("props.n in [{}]", (0..65).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
        let err = check_tree(parsed(&big).expression(), &Limits::REQUEST).unwrap_err();
        assert!(err.contains("list literal of 65 items; at most 64"), "{err}");
        let terms = (0..100).map(|i| format!("props.n == {i}")).collect::<Vec<_>>().join(" || ");
        let wide = Limits { length: 1 << 16, depth: 1 << 10, ..Limits::REQUEST };
        let err = check_tree(parsed(&terms).expression(), &wide).unwrap_err();
        assert!(err.contains("more than 256 terms"), "{err}");
    }
}
