use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

fn props<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> + 'a {
    move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

fn is_match(expr: &str, pairs: &[(&str, &str)]) -> bool {
    let filter = SqlFilter::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    filter.matches(&props(pairs))
}

#[test]
fn every_operator() {
    let m = [
        ("region", "eu"),
        ("amount", "150"),
        ("price", "9.5"),
        ("flag", "TRUE"),
        ("TAGS", "TagA"),
        ("name", "order-42-paid"),
    ];
    let cases: &[(&str, bool)] = &[
        ("region = 'eu'", true),
        ("region = 'us'", false),
        ("region <> 'us'", true),
        ("amount > 100", true),
        ("amount >= 150", true),
        ("amount < 150", false),
        ("amount <= 150.0", true),
        ("price > 9", true),
        ("price < 9.75", true),
        ("amount = 150.0", true),
        ("amount BETWEEN 100 AND 200", true),
        ("amount NOT BETWEEN 100 AND 200", false),
        ("price between 9.5 and 9.5", true),
        ("region IN ('us', 'eu')", true),
        ("region NOT IN ('us', 'eu')", false),
        ("TAGS IN ('TagA')", true),
        ("missing IS NULL", true),
        ("region IS NULL", false),
        ("region IS NOT NULL", true),
        ("flag = TRUE", true),
        ("flag = FALSE", false),
        ("name CONTAINS '42'", true),
        ("name STARTSWITH 'order'", true),
        ("name ENDSWITH 'paid'", true),
        ("name NOT ENDSWITH 'paid'", false),
        ("name NOT CONTAINS 'x'", true),
        ("TRUE", true),
        ("FALSE", false),
        ("NOT FALSE", true),
        ("region = 'eu' AND amount > 100", true),
        ("region = 'us' OR amount > 100", true),
        ("region = 'us' OR amount > 200", false),
        ("NOT (region = 'us' OR amount > 200)", true),
        ("region = 'us' AND amount > 100 OR price > 9", true),
        ("region = 'us' AND (amount > 100 OR price > 9)", false),
        ("amount > -5", true),
        ("-5 < amount", true),
        ("amount > 1e2", true),
        ("region > 1", false),
        ("region = 1", false),
        ("a.b_c$ IS NULL and TAGS = 'TagA'", true),
        ("  region='eu'  ", true),
        ("region = 'it''s'", false),
    ];
    for (expr, want) in cases {
        assert_eq!(is_match(expr, &m), *want, "{expr}");
    }
    assert!(is_match("q = 'it''s'", &[("q", "it's")]));
}

#[test]
fn a_missing_property_is_unknown_on_the_left_and_unequal_on_the_right() {
    for expr in [
        "a = 'x'",
        "a <> 'x'",
        "a > 1",
        "a <= 1",
        "a BETWEEN 1 AND 2",
        "a NOT BETWEEN 1 AND 2",
        "a IN ('x')",
        "a NOT IN ('x')",
        "a CONTAINS 'x'",
        "a NOT CONTAINS 'x'",
        "NOT a = 'x'",
        "NOT (a > 1)",
        "a = 'x' AND TRUE",
    ] {
        assert!(!is_match(expr, &[("b", "x")]), "{expr}");
    }
    // Unknown OR true is true; unknown AND false is false, and NOT of that is true.
    assert!(is_match("a = 'x' OR b = 'x'", &[("b", "x")]));
    assert!(is_match("NOT (a = 'x' AND b = 'y')", &[("b", "x")]));
    assert!(is_match("a IS NULL", &[("b", "x")]));
    // As RocketMQ: on the right, a missing property makes `=` false, not unknown.
    for (expr, want) in [
        ("'x' = a", false),
        ("'x' <> a", true),
        ("NOT ('x' = a)", true),
        ("5 <> a", true),
        ("b = a", false),
        ("b <> a", true),
        ("a = b", false),
        ("a <> b", false),
        ("a = c", true),
        ("a <> c", false),
        ("1 < a", false),
        ("NOT (1 < a)", false),
        // The text tests are false for a missing property, NOT forms too; so is an
        // empty pattern.
        ("NOT (a CONTAINS 'x')", true),
        ("NOT (a NOT STARTSWITH 'x')", true),
        ("b CONTAINS ''", false),
        ("b NOT ENDSWITH ''", false),
    ] {
        assert_eq!(is_match(expr, &[("b", "x")]), want, "{expr}");
    }
}

#[test]
fn keywords_are_case_insensitive() {
    assert!(is_match(
        "a between 1 and 3 And b iS nOt NuLl oR c in ('x')",
        &[("a", "2"), ("b", "")]
    ));
}

fn error(expr: &str) -> SqlError {
    match SqlFilter::parse(expr) {
        Err(e) => e,
        Ok(f) => panic!("{expr}: accepted as {f:?}"),
    }
}

#[test]
fn bad_expressions_are_refused_with_the_column() {
    let too_long = format!("a = '{}'", "x".repeat(4091));
    let cases: &[(&str, usize, &str)] = &[
        ("", 1, "expected a property or a constant"),
        ("a =", 4, "expected a property or a constant"),
        ("a = 'x' AND", 12, "expected a property or a constant"),
        ("a", 1, "expected a comparison"),
        ("a b", 3, "expected a comparison"),
        ("a = 'x", 5, "unterminated string"),
        ("a > 'x'", 1, "numbers only"),
        ("a BETWEEN 'x' AND 3", 1, "numbers only"),
        ("a BETWEEN 1 3", 13, "expected AND"),
        ("a IN (1)", 7, "IN lists strings"),
        ("a IN ('x' 'y')", 11, "expected ',' or ')'"),
        ("'x' IN ('x')", 1, "applies to a property"),
        ("a IS 3", 6, "expected NULL"),
        ("(a = 1", 7, "expected ')'"),
        ("a = 1)", 6, "unexpected ')'"),
        ("a # 1", 3, "unexpected character"),
        ("a = 1e999", 5, "bad number"),
        (
            "a = --9223372036854775808",
            5,
            "'-' must come before a number",
        ),
        ("a IN ('x'", 10, "expected ',' or ')'"),
        ("a CONTAINS", 11, "expected a string"),
        ("a != 1", 3, "(not equal is <>)"),
        ("a = \"x\"", 5, "(strings take single quotes)"),
        (&too_long, 1, "the expression is 4097 bytes; at most 4096"),
        ("a = 12abc", 5, "runs into a name"),
        ("a NOT = 1", 7, "after NOT"),
        ("a CONTAINS 1", 12, "expected a string"),
        ("a = - 'x'", 5, "'-' must come before a number"),
        ("é = 1", 1, "unexpected character"),
        ("x = 'é' AND", 12, "expected a property"),
    ];
    for (expr, column, words) in cases {
        let e = error(expr);
        assert!(e.message.contains(words), "{expr}: {e}");
        assert_eq!(e.column, *column, "{expr}: {e}");
        assert!(e.to_string().contains(&format!("column {column}")));
    }
}

/// As RocketMQ: an integer past 64 bits is read as a decimal, and -9223372036854775808
/// (whose digits alone do not fit) as the least 64-bit integer.
#[test]
fn integers_past_64_bits_are_decimals_and_the_least_one_an_integer() {
    assert!(is_match("a < 99999999999999999999", &[("a", "5")]));
    let most = [("a", "9223372036854775807")];
    assert!(!is_match("a > 99999999999999999999", &most));
    let least = "-9223372036854775808";
    assert!(is_match(&format!("a = {least}"), &[("a", least)]));
    let above = [("a", "-9223372036854775807")];
    assert!(is_match(&format!("a >= {least}"), &above));
    assert!(
        is_match("a > - 9223372036854775808", &above),
        "a sign apart"
    );
    assert!(!is_match(
        &format!("a < {least}"),
        &[("a", "-9223372036854775807")]
    ));
    assert!(!is_match(
        &format!("a = {least}"),
        &[("a", "-9223372036854775807")]
    ));
}

#[test]
fn size_and_depth_are_bounded() {
    let deep = format!("{}a = 1{}", "(".repeat(40), ")".repeat(40));
    assert!(error(&deep).message.contains("nested deeper"));
    let nots = format!("{}a = 1", "NOT ".repeat(40));
    assert!(error(&nots).message.contains("nested deeper"));
    let ok = format!("{}a = 1{}", "(".repeat(30), ")".repeat(30));
    assert!(is_match(&ok, &[("a", "1")]));
    // A long flat chain is fine (it is one node) up to the byte limit.
    let chain = vec!["a = 1"; 400].join(" OR ");
    assert!(is_match(&chain, &[("a", "1")]));
    let long = vec!["a = 1"; 1000].join(" OR ");
    assert!(error(&long).message.contains("at most"));
    // At most 64 distinct properties (each named as often as wanted).
    let names = |n: usize| {
        let terms: Vec<String> = (0..n).map(|i| format!("p{i} = 1 OR p{i} = 2")).collect();
        terms.join(" OR ")
    };
    let most = SqlFilter::parse(&names(64)).unwrap();
    assert_eq!(most.properties().len(), 64);
    assert_eq!(most.property_index(b"p63"), Some(63));
    assert_eq!(most.property_index(b"p64"), None);
    let e = error(&names(65));
    assert!(e.message.contains("65 distinct properties"), "{e}");
}

/// As RocketMQ: `BETWEEN` with constant bounds the wrong way round is refused where it is
/// parsed (it would match nothing); equal bounds and properties as bounds are fine, and so
/// are `NOT BETWEEN`'s bounds either way (RocketMQ checks them in `createBetween` only).
#[test]
fn between_bounds_the_wrong_way_round_are_refused() {
    for expr in [
        "a BETWEEN 5 AND 1",
        "a BETWEEN 2.5 AND 2",
        "a BETWEEN 3 AND 2.5",
    ] {
        let e = error(expr);
        assert!(e.message.contains("bounds must ascend"), "{expr}: {e}");
        assert_eq!(e.column, 1, "{expr}");
    }
    assert!(is_match("a BETWEEN 2 AND 2", &[("a", "2")]));
    assert!(is_match("a BETWEEN 1 AND 1.5", &[("a", "1.5")]));
    assert!(!is_match("a BETWEEN b AND 1", &[("a", "2"), ("b", "5")]));
    // Every number is below 5 or above 1.
    for a in ["0", "3", "7", "2.25"] {
        assert!(is_match("a NOT BETWEEN 5 AND 1", &[("a", a)]), "{a}");
        assert!(is_match("a NOT BETWEEN 2.5 AND 2", &[("a", a)]), "{a}");
    }
}

/// As RocketMQ (`v < low OR v > high`): `NOT BETWEEN` matches numbers outside the bounds
/// only, not a value that is no number (which compares false both ways).
#[test]
fn not_between_matches_numbers_outside_the_bounds_only() {
    let outside = "a NOT BETWEEN 1 AND 5";
    assert!(is_match(outside, &[("a", "7")]));
    assert!(is_match(outside, &[("a", "-1.5")]));
    assert!(!is_match(outside, &[("a", "3")]));
    for not_a_number in ["N/A", "", "true"] {
        assert!(
            !is_match(outside, &[("a", not_a_number)]),
            "{not_a_number:?}"
        );
        assert!(!is_match("a BETWEEN 1 AND 5", &[("a", not_a_number)]));
    }
    assert!(
        !is_match(outside, &[("b", "7")]),
        "a missing value is unknown"
    );
    assert!(is_match(&format!("NOT ({outside})"), &[("a", "3")]));
    // Negated again: the OR of two false comparisons is false, and NOT makes it true.
    assert!(is_match(&format!("NOT ({outside})"), &[("a", "x")]));
}

/// The distinct properties are listed once each, in the order they first appear, and
/// looked up by name the same way whether few (compared) or many (hashed).
#[test]
fn the_properties_named_are_listed_once_in_order() {
    let f = SqlFilter::parse("b = 1 AND (a > 2 OR b < 0) AND c IN ('x') AND TAGS IS NULL").unwrap();
    assert_eq!(f.properties(), ["b", "a", "c", "TAGS"]);
    assert_eq!(f.property_index(b"c"), Some(2));
    assert!(f.matches_values(&[Some("1"), Some("3"), Some("x"), None]));
    assert!(!f.matches_values(&[Some("1"), Some("3"), None, None]));
    let many: Vec<String> = (0..20).map(|i| format!("q{i} = '{i}'")).collect();
    let f = SqlFilter::parse(&many.join(" AND ")).unwrap();
    let values: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    let values: Vec<Option<&str>> = values.iter().map(|v| Some(v.as_str())).collect();
    assert!(f.matches_values(&values));
    assert_eq!(f.property_index(b"q19"), Some(19));
    assert_eq!(f.property_index(b"q20"), None);
}

// ---- Property-based: the filter against a simple reference evaluator. ----

/// A generated expression: rendered to text for the parser, evaluated directly by the
/// reference below.
#[derive(Debug, Clone)]
enum Gen {
    Const(bool),
    And(Vec<Gen>),
    Or(Vec<Gen>),
    Not(Box<Gen>),
    Cmp(&'static str, GenOperand, GenOperand),
    Between(String, GenOperand, GenOperand, bool),
    In(String, Vec<String>, bool),
    IsNull(String, bool),
    Text(&'static str, String, String, bool),
}

#[derive(Debug, Clone)]
enum GenOperand {
    Prop(String),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

const NAMES: &[&str] = &["a", "b", "c", "TAGS"];
const VALUES: &[&str] = &[
    "1", "2", "10", "-3", "1.5", "2.0", "1e1", "abc", "ab", "true", "TRUE", "false", "", "x y",
    "NaN", "inf", "it's",
];

fn name() -> impl Strategy<Value = String> {
    proptest::sample::select(NAMES).prop_map(str::to_owned)
}

fn text() -> impl Strategy<Value = String> {
    proptest::sample::select(VALUES).prop_map(str::to_owned)
}

fn number() -> impl Strategy<Value = GenOperand> {
    prop_oneof![
        (-12i64..12).prop_map(GenOperand::Int),
        (-40i64..40).prop_map(|n| GenOperand::Float(n as f64 / 4.0)),
    ]
}

fn any_operand() -> impl Strategy<Value = GenOperand> {
    prop_oneof![
        3 => name().prop_map(GenOperand::Prop),
        2 => text().prop_map(GenOperand::Str),
        2 => number(),
        1 => any::<bool>().prop_map(GenOperand::Bool),
    ]
}

fn numeric_operand() -> impl Strategy<Value = GenOperand> {
    prop_oneof![name().prop_map(GenOperand::Prop), number()]
}

fn constant(o: &GenOperand) -> Option<f64> {
    match o {
        GenOperand::Int(i) => Some(*i as f64),
        GenOperand::Float(f) => Some(*f),
        _ => None,
    }
}

fn leaf() -> impl Strategy<Value = Gen> {
    prop_oneof![
        1 => any::<bool>().prop_map(Gen::Const),
        3 => (proptest::sample::select(&["=", "<>"][..]), any_operand(), any_operand())
            .prop_map(|(op, l, r)| Gen::Cmp(op, l, r)),
        3 => (proptest::sample::select(&["<", "<=", ">", ">="][..]), numeric_operand(), numeric_operand())
            .prop_map(|(op, l, r)| Gen::Cmp(op, l, r)),
        2 => (name(), numeric_operand(), numeric_operand(), any::<bool>())
            .prop_map(|(p, lo, hi, neg)| {
                // Constant bounds the wrong way round are refused (a test of its own).
                let (lo, hi) = match (constant(&lo), constant(&hi)) {
                    (Some(l), Some(h)) if l > h => (hi, lo),
                    _ => (lo, hi),
                };
                Gen::Between(p, lo, hi, neg)
            }),
        2 => (name(), proptest::collection::vec(text(), 1..4), any::<bool>())
            .prop_map(|(p, list, neg)| Gen::In(p, list, neg)),
        1 => (name(), any::<bool>()).prop_map(|(p, neg)| Gen::IsNull(p, neg)),
        2 => (
            proptest::sample::select(&["CONTAINS", "STARTSWITH", "ENDSWITH"][..]),
            name(),
            text(),
            any::<bool>()
        )
            .prop_map(|(op, p, pat, neg)| Gen::Text(op, p, pat, neg)),
    ]
}

fn expression() -> impl Strategy<Value = Gen> {
    leaf().prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 2..4).prop_map(Gen::And),
            proptest::collection::vec(inner.clone(), 2..4).prop_map(Gen::Or),
            inner.prop_map(|e| Gen::Not(Box::new(e))),
        ]
    })
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn render_operand(o: &GenOperand) -> String {
    match o {
        GenOperand::Prop(p) => p.clone(),
        GenOperand::Str(s) => quote(s),
        GenOperand::Int(i) => i.to_string(),
        GenOperand::Float(f) => format!("{f:?}"),
        GenOperand::Bool(b) => if *b { "TRUE" } else { "false" }.to_owned(),
    }
}

/// Text with as few parentheses as precedence allows, so the parser's precedence is tested.
fn render(g: &Gen) -> String {
    let not = |neg: &bool| if *neg { "NOT " } else { "" };
    match g {
        Gen::Const(b) => if *b { "true" } else { "FALSE" }.to_owned(),
        Gen::And(parts) => parts
            .iter()
            .map(|p| match p {
                Gen::Or(_) => format!("({})", render(p)),
                _ => render(p),
            })
            .collect::<Vec<_>>()
            .join(" AND "),
        Gen::Or(parts) => parts.iter().map(render).collect::<Vec<_>>().join(" or "),
        Gen::Not(e) => match **e {
            Gen::And(_) | Gen::Or(_) => format!("NOT ({})", render(e)),
            _ => format!("not {}", render(e)),
        },
        Gen::Cmp(op, l, r) => format!("{} {op} {}", render_operand(l), render_operand(r)),
        Gen::Between(p, lo, hi, neg) => format!(
            "{p} {}BETWEEN {} AND {}",
            not(neg),
            render_operand(lo),
            render_operand(hi)
        ),
        Gen::In(p, list, neg) => format!(
            "{p} {}IN ({})",
            not(neg),
            list.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", ")
        ),
        Gen::IsNull(p, neg) => format!("{p} IS {}NULL", not(neg)),
        Gen::Text(op, p, pat, neg) => format!("{p} {}{op} {}", not(neg), quote(pat)),
    }
}

/// A value in the reference: owned, looked up in a map.
#[derive(Debug, Clone, PartialEq)]
enum RefValue {
    Missing,
    Text(String),
    Whole(i64),
    Real(f64),
    Truth(bool),
}

fn ref_value(o: &GenOperand, m: &HashMap<String, String>) -> RefValue {
    match o {
        GenOperand::Prop(p) => m
            .get(p)
            .map_or(RefValue::Missing, |v| RefValue::Text(v.clone())),
        GenOperand::Str(s) => RefValue::Text(s.clone()),
        GenOperand::Int(i) => RefValue::Whole(*i),
        GenOperand::Float(f) => RefValue::Real(*f),
        GenOperand::Bool(b) => RefValue::Truth(*b),
    }
}

/// A number as RocketMQ reads one (an integer, else a decimal; only digits, signs, point
/// and exponent).
fn ref_number(v: &RefValue) -> Option<f64> {
    match v {
        RefValue::Whole(i) => Some(*i as f64),
        RefValue::Real(f) => Some(*f),
        RefValue::Text(t) => {
            let plain = t.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c));
            if !plain {
                return None;
            }
            t.parse::<i64>()
                .map(|i| i as f64)
                .ok()
                .or_else(|| t.parse::<f64>().ok())
        }
        _ => None,
    }
}

fn ref_eq(l: &RefValue, r: &RefValue) -> Option<bool> {
    use RefValue::*;
    // RocketMQ's `doCreateEqual`: `lv == null ^ rv == null` is null for a null left
    // value, false otherwise; two nulls are equal.
    match (l, r) {
        (Missing, Missing) => return Some(true),
        (Missing, _) => return None,
        (_, Missing) => return Some(false),
        _ => {}
    }
    Some(match (l, r) {
        (Text(a), Text(b)) => a == b,
        (Truth(a), Truth(b)) => a == b,
        (Text(t), Truth(b)) | (Truth(b), Text(t)) => (t.to_lowercase() == "true") == *b,
        (Truth(_), _) | (_, Truth(_)) => false,
        _ => match (ref_number(l), ref_number(r)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        },
    })
}

fn ref_cmp(op: &str, l: &RefValue, r: &RefValue) -> Option<bool> {
    if *l == RefValue::Missing || *r == RefValue::Missing {
        return None;
    }
    let (Some(a), Some(b)) = (ref_number(l), ref_number(r)) else {
        return Some(false);
    };
    Some(match op {
        "<" => a < b,
        "<=" => a <= b,
        ">" => a > b,
        ">=" => a >= b,
        _ => unreachable!(),
    })
}

fn ref_eval(g: &Gen, m: &HashMap<String, String>) -> Option<bool> {
    let flip = |v: Option<bool>, neg: bool| if neg { v.map(|b| !b) } else { v };
    match g {
        Gen::Const(b) => Some(*b),
        Gen::And(parts) => {
            let vals: Vec<Option<bool>> = parts.iter().map(|p| ref_eval(p, m)).collect();
            if vals.contains(&Some(false)) {
                Some(false)
            } else if vals.contains(&None) {
                None
            } else {
                Some(true)
            }
        }
        Gen::Or(parts) => {
            let vals: Vec<Option<bool>> = parts.iter().map(|p| ref_eval(p, m)).collect();
            if vals.contains(&Some(true)) {
                Some(true)
            } else if vals.contains(&None) {
                None
            } else {
                Some(false)
            }
        }
        Gen::Not(e) => ref_eval(e, m).map(|b| !b),
        Gen::Cmp(op, l, r) => {
            let (l, r) = (ref_value(l, m), ref_value(r, m));
            match *op {
                "=" => ref_eq(&l, &r),
                "<>" => ref_eq(&l, &r).map(|b| !b),
                _ => ref_cmp(op, &l, &r),
            }
        }
        Gen::Between(p, lo, hi, false) => {
            let v = ref_value(&GenOperand::Prop(p.clone()), m);
            let low = ref_cmp(">=", &v, &ref_value(lo, m));
            let high = ref_cmp("<=", &v, &ref_value(hi, m));
            match (low, high) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            }
        }
        Gen::Between(p, lo, hi, true) => {
            let v = ref_value(&GenOperand::Prop(p.clone()), m);
            let below = ref_cmp("<", &v, &ref_value(lo, m));
            let above = ref_cmp(">", &v, &ref_value(hi, m));
            match (below, above) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            }
        }
        Gen::In(p, list, neg) => flip(m.get(p).map(|v| list.contains(v)), *neg),
        Gen::IsNull(p, neg) => Some(m.contains_key(p) == *neg),
        Gen::Text(op, p, pat, neg) => {
            // RocketMQ: `search == null || search.isEmpty()` and `rv == null` are FALSE,
            // in the NOT forms too.
            let Some(v) = m.get(p).filter(|_| !pat.is_empty()) else {
                return Some(false);
            };
            let found = match *op {
                "CONTAINS" => v.contains(pat.as_str()),
                "STARTSWITH" => v.starts_with(pat.as_str()),
                _ => v.ends_with(pat.as_str()),
            };
            Some(found != *neg)
        }
    }
}

fn property_set() -> impl Strategy<Value = HashMap<String, String>> {
    proptest::collection::hash_map(name(), text(), 0..=NAMES.len())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_filter_agrees_with_the_reference(g in expression(), sets in proptest::collection::vec(property_set(), 1..6)) {
        let text = render(&g);
        let filter = SqlFilter::parse(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        for m in &sets {
            let lookup = |name: &str| m.get(name).map(String::as_str);
            let want = ref_eval(&g, m) == Some(true);
            prop_assert_eq!(filter.matches(&lookup), want, "{} over {:?}", text, m);
            // The broker's way: each named property's value found once, then evaluated.
            let values: Vec<Option<&str>> =
                filter.properties().iter().map(|p| lookup(p)).collect();
            prop_assert_eq!(filter.matches_values(&values), want, "{} over {:?}", text, m);
        }
    }
}

// ---- Fuzz: any input is an expression or a typed error, never a panic. ----

const SQL_ATOMS: &[&str] = &[
    "a",
    "TAGS",
    "(",
    ")",
    "'x'",
    "'",
    "''",
    "1",
    "-",
    "1.5",
    "1e",
    "e5",
    ".",
    "=",
    "<>",
    "<",
    "<=",
    ">",
    ">=",
    "AND",
    "OR",
    "NOT",
    "BETWEEN",
    "IN",
    "IS",
    "NULL",
    "TRUE",
    "FALSE",
    "CONTAINS",
    "STARTSWITH",
    "ENDSWITH",
    ",",
    " ",
    "é",
    "\u{0}",
    "99999999999999999999",
];

proptest! {
    // Cases from PROPTEST_CASES (CI's fuzz run sets it high).
    #[test]
    fn fuzz_sql_parser_never_panics(
        atoms in proptest::collection::vec(proptest::sample::select(SQL_ATOMS), 0..40),
        raw in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let joined = atoms.join(" ");
        for input in [joined.clone(), atoms.concat(), String::from_utf8_lossy(&raw).into_owned()] {
            if let Err(e) = SqlFilter::parse(&input) {
                prop_assert!(e.column >= 1 && e.column <= input.chars().count() + 1, "{input:?}: {e}");
            } else if let Ok(f) = SqlFilter::parse(&input) {
                // Whatever parses evaluates without a panic.
                let _ = f.matches(&|_: &str| Some("1"));
                let _ = f.matches(&|_: &str| None);
            }
        }
    }
}

/// What a parsed filter holds is counted from its nodes and strings (what
/// `--sql-filters-mb` bounds): a long chain of comparisons takes many times its text.
#[test]
fn a_filters_memory_counts_its_nodes() {
    let chain: Vec<String> = (0..600).map(|i| format!("a > {i}")).collect();
    let chain = chain.join(" OR ");
    let chain = &chain[..chain[..4000].rfind(" OR ").unwrap()];
    let long = SqlFilter::parse(chain).unwrap();
    let node = std::mem::size_of::<Expr>();
    let leaves = chain.matches(" OR ").count() + 1;
    assert!(long.heap_bytes() >= leaves * node, "{}", long.heap_bytes());
    assert!(long.heap_bytes() > 8 * chain.len(), "{}", long.heap_bytes());
    let short = SqlFilter::parse("a = 1").unwrap();
    assert!(short.heap_bytes() < 512, "{}", short.heap_bytes());
    // A chain's work per record grows with its comparisons and the properties' bytes.
    assert_eq!(long.work_per_record(100), leaves * 116 + chain.len());
    assert_eq!(short.work_per_record(100), 116 + 5);
    // Each property a comparison reads counts, a BETWEEN's value twice.
    let between = SqlFilter::parse("a BETWEEN b AND c").unwrap();
    assert_eq!(between.work_per_record(100), 4 * 116 + 17);
    let both = SqlFilter::parse("a = b OR 1 = 1").unwrap();
    assert_eq!(both.work_per_record(100), 3 * 116 + 14);
}
