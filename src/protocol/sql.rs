//! SQL92 property filters, RocketMQ's grammar: a boolean expression over a message's
//! properties (every one, as RocketMQ: the user's, `TAGS`, and system ones such as `KEYS`),
//! parsed once per subscription and evaluated per message over the
//! record's property block in place (no allocation per message).
//!
//! ```text
//! expr      := or
//! or        := and (OR and)*
//! and       := not (AND not)*
//! not       := NOT not | primary
//! primary   := '(' expr ')'
//!            | operand ( ('=' | '<>' | '<' | '<=' | '>' | '>=') operand
//!                      | [NOT] BETWEEN operand AND operand
//!                      | [NOT] IN '(' string (',' string)* ')'
//!                      | IS [NOT] NULL
//!                      | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string )
//!            | TRUE | FALSE
//! operand   := property | string | ['-'] number | TRUE | FALSE
//! ```
//! Keywords are case-insensitive; a property is `[A-Za-z_$][A-Za-z0-9_$.]*`; strings are
//! single-quoted (`''` is a quote); numbers are integers (`i64`) or decimals (`f64`, with an
//! optional exponent).
//!
//! Semantics (as RocketMQ, but for one difference): property values are strings. Compared
//! with a number, a value is read as a number (an integer, else a decimal); one that is not
//! a number compares false (the difference: RocketMQ fails the whole expression for that
//! message, so `a <> 5` does not match `a = 'abc'` there, and matches it here).
//! Compared with `TRUE`/`FALSE`, `"true"` (any case) is true and anything else false.
//! `<`, `<=`, `>`, `>=` and `BETWEEN` compare numbers only: a string or boolean constant
//! there is refused when parsing; `v NOT BETWEEN a AND b` is `v < a OR v > b`, so a value
//! that is not a number matches neither form. A missing property makes a comparison
//! *unknown*, and unknown is not a match: `NOT`, `AND` and `OR` follow SQL's three-valued logic
//! (`NOT unknown` is unknown, `unknown OR true` is true), so `a <> 'x'` and `a NOT IN ('x')`
//! do not match a message without `a`; `IS NULL` / `IS NOT NULL` test presence. As in
//! RocketMQ, `=` and `<>` are not symmetric there: with the property on the right, a missing
//! one makes `'x' = a` false (so `'x' <> a` matches), and `a = b` holds when both are
//! missing; the text tests (`CONTAINS`, `STARTSWITH`, `ENDSWITH`, and their `NOT` forms)
//! are false for a missing property or an empty pattern.

use std::cmp::Ordering;
use std::fmt;

/// Longest expression accepted, in bytes.
pub const SQL_EXPRESSION_BYTES_MAX: usize = 4096;
/// Deepest nesting of parentheses and `NOT`s.
pub const SQL_DEPTH_MAX: usize = 32;
/// Most distinct properties one expression may name.
pub const SQL_PROPERTIES_MAX: usize = 64;

/// A bad expression: where (1-based column, in characters) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad SQL filter at column {column}: {message}")]
pub struct SqlError {
    pub column: usize,
    pub message: String,
}

/// A parsed filter. Evaluate it with [`SqlFilter::matches`], or with
/// [`SqlFilter::matches_values`] once the values of its [`properties`](SqlFilter::properties)
/// are found (one pass over a record's properties, however often the expression names them).
#[derive(Debug, Clone, PartialEq)]
pub struct SqlFilter {
    root: Expr,
    /// The distinct properties the expression names, in the order they first appear.
    properties: Vec<String>,
    /// Their indexes by name, when more than a few (else found by comparing each).
    index: Option<std::collections::HashMap<Box<[u8]>, usize>>,
    /// The property values one evaluation reads (at least one per comparison).
    reads: usize,
    /// Bytes of the expression's text.
    text_bytes: usize,
}

/// Properties past which [`SqlFilter::property_index`] hashes instead of comparing each.
const PROPERTIES_COMPARED_MAX: usize = 8;

/// A node of the expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A constant `TRUE` or `FALSE` standing alone.
    Const(bool),
    /// All must hold (two or more).
    And(Vec<Expr>),
    /// One must hold (two or more).
    Or(Vec<Expr>),
    Not(Box<Expr>),
    Compare(CmpOp, Operand, Operand),
    Between {
        value: Operand,
        low: Operand,
        high: Operand,
        negated: bool,
    },
    In {
        property: String,
        list: Vec<String>,
        negated: bool,
    },
    IsNull {
        operand: Operand,
        negated: bool,
    },
    Text {
        op: TextOp,
        property: String,
        pattern: String,
        negated: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextOp {
    Contains,
    StartsWith,
    EndsWith,
}

/// A side of a comparison.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    Property(String),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// A value during evaluation: borrowed from the record or the expression.
#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Null,
    Str(&'a str),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// A number read from a value.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn of_str(s: &str) -> Option<Num> {
        // Digits, signs, a point and an exponent only: not `inf` or `NaN`, which Rust's
        // float parser would take.
        if !s
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.' | b'e' | b'E'))
        {
            return None;
        }
        if let Ok(i) = s.parse::<i64>() {
            return Some(Num::Int(i));
        }
        s.parse::<f64>().ok().map(Num::Float)
    }

    fn of(value: Value<'_>) -> Option<Num> {
        match value {
            Value::Int(i) => Some(Num::Int(i)),
            Value::Float(f) => Some(Num::Float(f)),
            Value::Str(s) => Num::of_str(s),
            Value::Null | Value::Bool(_) => None,
        }
    }

    fn cmp(self, other: Num) -> Option<Ordering> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

/// `Some(b)` known, `None` unknown (a missing property).
type Truth = Option<bool>;

fn equal(a: Value<'_>, b: Value<'_>) -> Truth {
    Some(match (a, b) {
        // As RocketMQ's `=` (and `<>`, its negation): a missing left side is unknown, a
        // missing right side beside a present left one is false, two missing are equal.
        (Value::Null, Value::Null) => true,
        (Value::Null, _) => return None,
        (_, Value::Null) => false,
        (Value::Str(x), Value::Str(y)) => x == y,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Str(s), Value::Bool(b)) | (Value::Bool(b), Value::Str(s)) => {
            s.eq_ignore_ascii_case("true") == b
        }
        (Value::Bool(_), _) | (_, Value::Bool(_)) => false,
        (x, y) => match (Num::of(x), Num::of(y)) {
            (Some(x), Some(y)) => x.cmp(y) == Some(Ordering::Equal),
            _ => false,
        },
    })
}

fn order(a: Value<'_>, b: Value<'_>, holds: fn(Ordering) -> bool) -> Truth {
    if matches!(a, Value::Null) || matches!(b, Value::Null) {
        return None;
    }
    Some(match (Num::of(a), Num::of(b)) {
        (Some(x), Some(y)) => x.cmp(y).is_some_and(holds),
        _ => false,
    })
}

fn and(a: Truth, b: Truth) -> Truth {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn or(a: Truth, b: Truth) -> Truth {
    match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

fn negate(t: Truth, negated: bool) -> Truth {
    t.map(|b| b != negated)
}

impl SqlFilter {
    /// The first check of [`Self::parse`], alone: an expression longer than
    /// [`SQL_EXPRESSION_BYTES_MAX`] is refused.
    pub fn check_length(source: &str) -> Result<(), SqlError> {
        if source.len() > SQL_EXPRESSION_BYTES_MAX {
            return Err(SqlError {
                column: 1,
                message: format!(
                    "the expression is {} bytes; at most {SQL_EXPRESSION_BYTES_MAX}",
                    source.len()
                ),
            });
        }
        Ok(())
    }

    /// Parses an expression; a typed error with the column of the problem otherwise.
    pub fn parse(source: &str) -> Result<SqlFilter, SqlError> {
        Self::check_length(source)?;
        let tokens = lex(source)?;
        let mut parser = Parser {
            source,
            tokens,
            at: 0,
            depth: 0,
        };
        let root = parser.expr()?;
        if let Some(t) = parser.peek() {
            return Err(parser.error_at(t.start, format!("unexpected {}", t.kind)));
        }
        let mut properties: Vec<String> = Vec::new();
        let mut named = |name: &String| {
            if !properties.contains(name) {
                properties.push(name.clone());
            }
        };
        each_property(&root, &mut named);
        if properties.len() > SQL_PROPERTIES_MAX {
            return Err(SqlError {
                column: 1,
                message: format!(
                    "names {} distinct properties; at most {SQL_PROPERTIES_MAX}",
                    properties.len()
                ),
            });
        }
        let index = (properties.len() > PROPERTIES_COMPARED_MAX).then(|| {
            let named = properties.iter().enumerate();
            named.map(|(i, p)| (p.as_bytes().into(), i)).collect()
        });
        Ok(SqlFilter {
            reads: reads(&root),
            root,
            properties,
            index,
            text_bytes: source.len(),
        })
    }

    /// About the bytes of memory the parsed filter holds: its nodes and strings, and what
    /// the allocator adds to each.
    pub fn heap_bytes(&self) -> usize {
        let names = |s: &String| ALLOCATION_BYTES + std::mem::size_of::<String>() + s.capacity();
        let index = self.index.as_ref().map_or(0, |i| {
            let entry = std::mem::size_of::<(Box<[u8]>, usize)>() + 1;
            i.capacity() * entry + i.keys().map(|k| ALLOCATION_BYTES + k.len()).sum::<usize>()
        });
        std::mem::size_of::<SqlFilter>()
            + heap_bytes(&self.root)
            + self.properties.iter().map(names).sum::<usize>()
            + index
    }

    /// An upper bound on the bytes an evaluation over a record whose property block has
    /// `properties_bytes` looks at: each value a comparison reads (at most the block) and
    /// the expression's own constants (at most its text).
    pub fn work_per_record(&self, properties_bytes: usize) -> usize {
        self.reads
            .saturating_mul(properties_bytes.saturating_add(16))
            .saturating_add(self.text_bytes)
    }

    /// The distinct properties the expression names, in the order they first appear.
    pub fn properties(&self) -> &[String] {
        &self.properties
    }

    /// The index of `name` in [`properties`](Self::properties), if the expression names it.
    pub fn property_index(&self, name: &[u8]) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(name).copied(),
            None => self.properties.iter().position(|p| p.as_bytes() == name),
        }
    }

    /// [`matches`](Self::matches) with `values[i]` the value of `properties()[i]`.
    pub fn matches_values(&self, values: &[Option<&str>]) -> bool {
        let property = |name: &str| {
            let i = self.property_index(name.as_bytes())?;
            values.get(i).copied().flatten()
        };
        eval(&self.root, &property) == Some(true)
    }

    /// The expression tree.
    pub fn root(&self) -> &Expr {
        &self.root
    }

    /// Whether a message with these properties matches: `property(name)` gives a
    /// property's value (`TAGS` included), `None` when absent. Unknown is no match.
    pub fn matches<'r>(&self, property: &impl Fn(&str) -> Option<&'r str>) -> bool {
        eval(&self.root, property) == Some(true)
    }
}

/// Calls `f` with the values `props` has of the properties `filter` names (see
/// [`SqlFilter::matches_values`]), found in one pass over them.
pub fn with_values_of<'a, T>(
    filter: &SqlFilter,
    props: &crate::protocol::record::Properties<'a>,
    f: impl FnOnce(&[Option<&'a str>]) -> T,
) -> T {
    // A few on the stack (zeroing room for all 64 cost more than the usual filter's pass).
    let n = filter.properties.len();
    let mut few = [None; PROPERTIES_COMPARED_MAX];
    let mut many = Vec::new();
    let values: &mut [Option<&'a str>] = if n <= PROPERTIES_COMPARED_MAX {
        &mut few[..n]
    } else {
        many.resize(n, None);
        &mut many
    };
    props.values_of(|name| filter.property_index(name), values);
    f(values)
}

/// What an allocation holds beyond its bytes (the allocator's header and rounding).
const ALLOCATION_BYTES: usize = 16;

/// The property values one evaluation of `expr` reads, at least one per comparison (a
/// `BETWEEN` reads its value twice).
fn reads(expr: &Expr) -> usize {
    let property = |o: &Operand| usize::from(matches!(o, Operand::Property(_)));
    match expr {
        Expr::And(parts) | Expr::Or(parts) => parts.iter().map(reads).sum(),
        Expr::Not(e) => reads(e),
        Expr::Compare(_, l, r) => (property(l) + property(r)).max(1),
        Expr::Between {
            value, low, high, ..
        } => (2 * property(value) + property(low) + property(high)).max(1),
        _ => 1,
    }
}

/// The heap bytes of `expr`'s children and strings (not of the node itself).
fn heap_bytes(expr: &Expr) -> usize {
    let string = |s: &String| match s.capacity() {
        0 => 0,
        n => n + ALLOCATION_BYTES,
    };
    let operand = |o: &Operand| match o {
        Operand::Property(s) | Operand::Str(s) => string(s),
        _ => 0,
    };
    let node = std::mem::size_of::<Expr>();
    match expr {
        Expr::Const(_) => 0,
        Expr::And(parts) | Expr::Or(parts) => {
            let nodes = ALLOCATION_BYTES + parts.capacity() * node;
            nodes + parts.iter().map(heap_bytes).sum::<usize>()
        }
        Expr::Not(e) => ALLOCATION_BYTES + node + heap_bytes(e),
        Expr::Compare(_, l, r) => operand(l) + operand(r),
        Expr::Between {
            value, low, high, ..
        } => operand(value) + operand(low) + operand(high),
        Expr::In { property, list, .. } => {
            let strings = list.capacity() * std::mem::size_of::<String>() + ALLOCATION_BYTES;
            string(property) + strings + list.iter().map(string).sum::<usize>()
        }
        Expr::IsNull { operand: o, .. } => operand(o),
        Expr::Text {
            property, pattern, ..
        } => string(property) + string(pattern),
    }
}

/// Calls `f` with each property name in `expr`.
fn each_property(expr: &Expr, f: &mut impl FnMut(&String)) {
    let mut operand = |o: &Operand| {
        if let Operand::Property(name) = o {
            f(name);
        }
    };
    match expr {
        Expr::Const(_) => {}
        Expr::And(parts) | Expr::Or(parts) => parts.iter().for_each(|e| each_property(e, f)),
        Expr::Not(e) => each_property(e, f),
        Expr::Compare(_, l, r) => {
            operand(l);
            operand(r);
        }
        Expr::Between {
            value, low, high, ..
        } => {
            operand(value);
            operand(low);
            operand(high);
        }
        Expr::IsNull { operand: o, .. } => operand(o),
        Expr::In { property, .. } | Expr::Text { property, .. } => f(property),
    }
}

fn value<'x, 'r: 'x>(
    operand: &'x Operand,
    property: &impl Fn(&str) -> Option<&'r str>,
) -> Value<'x> {
    match operand {
        Operand::Property(name) => property(name).map_or(Value::Null, Value::Str),
        Operand::Str(s) => Value::Str(s),
        Operand::Int(i) => Value::Int(*i),
        Operand::Float(f) => Value::Float(*f),
        Operand::Bool(b) => Value::Bool(*b),
    }
}

fn eval<'r>(expr: &Expr, property: &impl Fn(&str) -> Option<&'r str>) -> Truth {
    match expr {
        Expr::Const(b) => Some(*b),
        Expr::And(parts) => {
            let mut acc = Some(true);
            for e in parts {
                acc = and(acc, eval(e, property));
                if acc == Some(false) {
                    break;
                }
            }
            acc
        }
        Expr::Or(parts) => {
            let mut acc = Some(false);
            for e in parts {
                acc = or(acc, eval(e, property));
                if acc == Some(true) {
                    break;
                }
            }
            acc
        }
        Expr::Not(e) => eval(e, property).map(|b| !b),
        Expr::Compare(op, l, r) => {
            let (l, r) = (value(l, property), value(r, property));
            match op {
                CmpOp::Eq => equal(l, r),
                CmpOp::Ne => equal(l, r).map(|b| !b),
                CmpOp::Lt => order(l, r, Ordering::is_lt),
                CmpOp::Le => order(l, r, Ordering::is_le),
                CmpOp::Gt => order(l, r, Ordering::is_gt),
                CmpOp::Ge => order(l, r, Ordering::is_ge),
            }
        }
        Expr::Between {
            value: v,
            low,
            high,
            negated,
        } => {
            let (v, low, high) = (
                value(v, property),
                value(low, property),
                value(high, property),
            );
            // As RocketMQ: `NOT BETWEEN` is `v < low OR v > high`, not the negation of
            // `BETWEEN`, so a value that is not a number matches neither.
            if *negated {
                or(
                    order(v, low, Ordering::is_lt),
                    order(v, high, Ordering::is_gt),
                )
            } else {
                and(
                    order(v, low, Ordering::is_ge),
                    order(v, high, Ordering::is_le),
                )
            }
        }
        Expr::In {
            property: name,
            list,
            negated,
        } => {
            let found = property(name).map(|v| list.iter().any(|s| s == v));
            negate(found, *negated)
        }
        Expr::IsNull { operand, negated } => {
            let null = matches!(value(operand, property), Value::Null);
            Some(null != *negated)
        }
        Expr::Text {
            op,
            property: name,
            pattern,
            negated,
        } => {
            // As RocketMQ's ContainsExpression and its kin: a missing property or an empty
            // pattern is false, for the negated forms too (each is its own test, not the
            // negation of the other).
            let Some(v) = property(name).filter(|_| !pattern.is_empty()) else {
                return Some(false);
            };
            let found = match op {
                TextOp::Contains => v.contains(pattern.as_str()),
                TextOp::StartsWith => v.starts_with(pattern.as_str()),
                TextOp::EndsWith => v.ends_with(pattern.as_str()),
            };
            Some(found != *negated)
        }
    }
}

mod parse;
pub use parse::op_text;
use parse::{lex, Parser};

#[cfg(test)]
mod tests;
