//! SQL92 property filters, RocketMQ's grammar: a boolean expression over a message's user
//! properties and its `TAGS`, parsed once per subscription and evaluated per message over the
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
//! Semantics (as RocketMQ): property values are strings. Compared with a number, a value is
//! read as a number (an integer, else a decimal); one that is not a number compares false.
//! Compared with `TRUE`/`FALSE`, `"true"` (any case) is true and anything else false.
//! `<`, `<=`, `>`, `>=` and `BETWEEN` compare numbers only: a string or boolean constant
//! there is refused when parsing. A missing property makes a comparison *unknown*, and
//! unknown is not a match: `NOT`, `AND` and `OR` follow SQL's three-valued logic
//! (`NOT unknown` is unknown, `unknown OR true` is true), so `a <> 'x'` and `a NOT IN ('x')`
//! do not match a message without `a`; `IS NULL` / `IS NOT NULL` test presence.

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
        (Value::Null, _) | (_, Value::Null) => return None,
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
    /// Parses an expression; a typed error with the column of the problem otherwise.
    pub fn parse(source: &str) -> Result<SqlFilter, SqlError> {
        if source.len() > SQL_EXPRESSION_BYTES_MAX {
            return Err(SqlError {
                column: 1,
                message: format!("{} bytes; at most {SQL_EXPRESSION_BYTES_MAX}", source.len()),
            });
        }
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
            root,
            properties,
            index,
        })
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
            let v = value(v, property);
            let inside = and(
                order(v, value(low, property), Ordering::is_ge),
                order(v, value(high, property), Ordering::is_le),
            );
            negate(inside, *negated)
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
            let found = property(name).map(|v| match op {
                TextOp::Contains => v.contains(pattern.as_str()),
                TextOp::StartsWith => v.starts_with(pattern.as_str()),
                TextOp::EndsWith => v.ends_with(pattern.as_str()),
            });
            negate(found, *negated)
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum TokenKind {
    Ident(String),
    Keyword(Keyword),
    Str(String),
    Int(i64),
    Float(f64),
    Op(CmpOp),
    LParen,
    RParen,
    Comma,
    Minus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keyword {
    And,
    Or,
    Not,
    Between,
    In,
    Is,
    Null,
    True,
    False,
    Contains,
    StartsWith,
    EndsWith,
}

const KEYWORDS: &[(&str, Keyword)] = &[
    ("AND", Keyword::And),
    ("OR", Keyword::Or),
    ("NOT", Keyword::Not),
    ("BETWEEN", Keyword::Between),
    ("IN", Keyword::In),
    ("IS", Keyword::Is),
    ("NULL", Keyword::Null),
    ("TRUE", Keyword::True),
    ("FALSE", Keyword::False),
    ("CONTAINS", Keyword::Contains),
    ("STARTSWITH", Keyword::StartsWith),
    ("ENDSWITH", Keyword::EndsWith),
];

impl fmt::Display for TokenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenKind::Ident(name) => write!(f, "property {name}"),
            TokenKind::Keyword(k) => {
                let name = KEYWORDS
                    .iter()
                    .find(|(_, kw)| kw == k)
                    .map_or("?", |(n, _)| n);
                write!(f, "{name}")
            }
            TokenKind::Str(s) => write!(f, "string '{s}'"),
            TokenKind::Int(i) => write!(f, "number {i}"),
            TokenKind::Float(x) => write!(f, "number {x}"),
            TokenKind::Op(op) => write!(f, "'{}'", op_text(*op)),
            TokenKind::LParen => write!(f, "'('"),
            TokenKind::RParen => write!(f, "')'"),
            TokenKind::Comma => write!(f, "','"),
            TokenKind::Minus => write!(f, "'-'"),
        }
    }
}

/// The operator as written in an expression.
pub fn op_text(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Eq => "=",
        CmpOp::Ne => "<>",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    }
}

#[derive(Debug, Clone)]
struct Token {
    kind: TokenKind,
    /// Byte offset in the source.
    start: usize,
}

fn column(source: &str, byte: usize) -> usize {
    source
        .get(..byte)
        .map_or(byte, |prefix| prefix.chars().count())
        + 1
}

fn lex(source: &str) -> Result<Vec<Token>, SqlError> {
    let error = |at: usize, message: String| SqlError {
        column: column(source, at),
        message,
    };
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let kind = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'(' => {
                i += 1;
                TokenKind::LParen
            }
            b')' => {
                i += 1;
                TokenKind::RParen
            }
            b',' => {
                i += 1;
                TokenKind::Comma
            }
            b'-' => {
                i += 1;
                TokenKind::Minus
            }
            b'=' => {
                i += 1;
                TokenKind::Op(CmpOp::Eq)
            }
            b'<' => match bytes.get(i + 1) {
                Some(b'=') => {
                    i += 2;
                    TokenKind::Op(CmpOp::Le)
                }
                Some(b'>') => {
                    i += 2;
                    TokenKind::Op(CmpOp::Ne)
                }
                _ => {
                    i += 1;
                    TokenKind::Op(CmpOp::Lt)
                }
            },
            b'>' => {
                if bytes.get(i + 1) == Some(&b'=') {
                    i += 2;
                    TokenKind::Op(CmpOp::Ge)
                } else {
                    i += 1;
                    TokenKind::Op(CmpOp::Gt)
                }
            }
            b'\'' => {
                let mut s = String::new();
                i += 1;
                loop {
                    let Some(rest) = source.get(i..) else {
                        return Err(error(start, "unterminated string".into()));
                    };
                    let Some(q) = rest.find('\'') else {
                        return Err(error(start, "unterminated string".into()));
                    };
                    s.push_str(&rest[..q]);
                    i += q + 1;
                    if bytes.get(i) == Some(&b'\'') {
                        s.push('\'');
                        i += 1;
                    } else {
                        break;
                    }
                }
                TokenKind::Str(s)
            }
            b'0'..=b'9' | b'.' => {
                let mut float = false;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                if bytes.get(i) == Some(&b'.') {
                    float = true;
                    i += 1;
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                }
                if matches!(bytes.get(i), Some(b'e' | b'E')) {
                    float = true;
                    i += 1;
                    if matches!(bytes.get(i), Some(b'+' | b'-')) {
                        i += 1;
                    }
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                }
                if bytes
                    .get(i)
                    .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_' || *b == b'$')
                {
                    return Err(error(start, "a number runs into a name".into()));
                }
                let text = &source[start..i];
                if float {
                    match text.parse::<f64>() {
                        Ok(x) if x.is_finite() => TokenKind::Float(x),
                        _ => return Err(error(start, format!("bad number {text}"))),
                    }
                } else {
                    match text.parse::<i64>() {
                        Ok(n) => TokenKind::Int(n),
                        Err(_) => {
                            return Err(error(start, format!("{text} does not fit in 64 bits")))
                        }
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b'$' => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'_' | b'$' | b'.'))
                {
                    i += 1;
                }
                let word = &source[start..i];
                match KEYWORDS
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case(word))
                {
                    Some((_, k)) => TokenKind::Keyword(*k),
                    None => TokenKind::Ident(word.to_owned()),
                }
            }
            _ => {
                let ch = source[start..].chars().next().unwrap_or('?');
                return Err(error(start, format!("unexpected character {ch:?}")));
            }
        };
        tokens.push(Token { kind, start });
    }
    Ok(tokens)
}

struct Parser<'s> {
    source: &'s str,
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser<'_> {
    fn error_at(&self, byte: usize, message: String) -> SqlError {
        SqlError {
            column: column(self.source, byte),
            message,
        }
    }

    /// An error at the current token, or at the end.
    fn error_here(&self, message: impl Into<String>) -> SqlError {
        let at = self
            .tokens
            .get(self.at)
            .map_or(self.source.len(), |t| t.start);
        self.error_at(at, message.into())
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn peek_kind(&self) -> Option<&TokenKind> {
        self.peek().map(|t| &t.kind)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.at).cloned();
        if t.is_some() {
            self.at += 1;
        }
        t
    }

    fn eat_keyword(&mut self, k: Keyword) -> bool {
        if self.peek_kind() == Some(&TokenKind::Keyword(k)) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, kind: TokenKind, what: &str) -> Result<(), SqlError> {
        match self.peek_kind() {
            Some(k) if *k == kind => {
                self.at += 1;
                Ok(())
            }
            Some(k) => Err(self.error_here(format!("expected {what}, found {k}"))),
            None => Err(self.error_here(format!("expected {what} at the end"))),
        }
    }

    fn deeper(&mut self) -> Result<(), SqlError> {
        self.depth += 1;
        if self.depth > SQL_DEPTH_MAX {
            return Err(self.error_here(format!("nested deeper than {SQL_DEPTH_MAX} levels")));
        }
        Ok(())
    }

    fn expr(&mut self) -> Result<Expr, SqlError> {
        let mut parts = vec![self.and()?];
        while self.eat_keyword(Keyword::Or) {
            parts.push(self.and()?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Expr::Or(parts)
        })
    }

    fn and(&mut self) -> Result<Expr, SqlError> {
        let mut parts = vec![self.not()?];
        while self.eat_keyword(Keyword::And) {
            parts.push(self.not()?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Expr::And(parts)
        })
    }

    fn not(&mut self) -> Result<Expr, SqlError> {
        if self.eat_keyword(Keyword::Not) {
            self.deeper()?;
            let inner = self.not()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, SqlError> {
        if self.peek_kind() == Some(&TokenKind::LParen) {
            self.at += 1;
            self.deeper()?;
            let inner = self.expr()?;
            self.depth -= 1;
            self.expect(TokenKind::RParen, "')'")?;
            return Ok(inner);
        }
        let start = self.peek().map_or(self.source.len(), |t| t.start);
        let left = self.operand()?;
        let negated = self.eat_keyword(Keyword::Not);
        let Some(next) = self.peek_kind().cloned() else {
            if negated {
                return Err(self.error_here(
                    "expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT",
                ));
            }
            return standalone(left).ok_or_else(|| {
                self.error_at(start, "expected a comparison after the operand".into())
            });
        };
        match next {
            TokenKind::Op(op) if !negated => {
                self.at += 1;
                let right = self.operand()?;
                if matches!(op, CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge) {
                    self.check_numeric(&left, start)?;
                    self.check_numeric(&right, start)?;
                }
                Ok(Expr::Compare(op, left, right))
            }
            TokenKind::Keyword(Keyword::Between) => {
                self.at += 1;
                let low = self.operand()?;
                if !self.eat_keyword(Keyword::And) {
                    return Err(self.error_here("expected AND in BETWEEN"));
                }
                let high = self.operand()?;
                for o in [&left, &low, &high] {
                    self.check_numeric(o, start)?;
                }
                // As RocketMQ: constant bounds the wrong way round are refused, not a filter
                // that matches nothing.
                let above = match (&low, &high) {
                    (Operand::Int(l), Operand::Int(h)) => l > h,
                    (Operand::Int(l), Operand::Float(h)) => (*l as f64) > *h,
                    (Operand::Float(l), Operand::Int(h)) => *l > (*h as f64),
                    (Operand::Float(l), Operand::Float(h)) => l > h,
                    _ => false,
                };
                if above {
                    return Err(self.error_at(
                        start,
                        "BETWEEN's bounds must ascend: the low one is above the high one".into(),
                    ));
                }
                Ok(Expr::Between {
                    value: left,
                    low,
                    high,
                    negated,
                })
            }
            TokenKind::Keyword(Keyword::In) => {
                self.at += 1;
                let property = self.property_of(left, start, "IN")?;
                self.expect(TokenKind::LParen, "'(' after IN")?;
                let mut list = Vec::new();
                loop {
                    match self.next() {
                        Some(Token {
                            kind: TokenKind::Str(s),
                            ..
                        }) => list.push(s),
                        Some(t) => {
                            return Err(self
                                .error_at(t.start, format!("IN lists strings, found {}", t.kind)))
                        }
                        None => return Err(self.error_here("unfinished IN list")),
                    }
                    match self.next().map(|t| t.kind) {
                        Some(TokenKind::Comma) => continue,
                        Some(TokenKind::RParen) => break,
                        _ => {
                            self.at = self.at.saturating_sub(1);
                            return Err(self.error_here("expected ',' or ')' in the IN list"));
                        }
                    }
                }
                Ok(Expr::In {
                    property,
                    list,
                    negated,
                })
            }
            TokenKind::Keyword(Keyword::Is) if !negated => {
                self.at += 1;
                let negated = self.eat_keyword(Keyword::Not);
                if !self.eat_keyword(Keyword::Null) {
                    return Err(self.error_here("expected NULL after IS"));
                }
                Ok(Expr::IsNull {
                    operand: left,
                    negated,
                })
            }
            TokenKind::Keyword(
                k @ (Keyword::Contains | Keyword::StartsWith | Keyword::EndsWith),
            ) => {
                self.at += 1;
                let op = match k {
                    Keyword::Contains => TextOp::Contains,
                    Keyword::StartsWith => TextOp::StartsWith,
                    _ => TextOp::EndsWith,
                };
                let property = self.property_of(left, start, "CONTAINS, STARTSWITH or ENDSWITH")?;
                match self.next() {
                    Some(Token {
                        kind: TokenKind::Str(pattern),
                        ..
                    }) => Ok(Expr::Text {
                        op,
                        property,
                        pattern,
                        negated,
                    }),
                    _ => {
                        self.at = self.at.saturating_sub(1);
                        Err(self.error_here("expected a string"))
                    }
                }
            }
            _ if negated => {
                Err(self
                    .error_here("expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT"))
            }
            _ => standalone(left)
                .ok_or_else(|| self.error_here(format!("expected a comparison, found {next}"))),
        }
    }

    fn operand(&mut self) -> Result<Operand, SqlError> {
        let Some(t) = self.next() else {
            return Err(self.error_here("expected a property or a constant at the end"));
        };
        Ok(match t.kind {
            TokenKind::Ident(name) => Operand::Property(name),
            TokenKind::Str(s) => Operand::Str(s),
            TokenKind::Int(i) => Operand::Int(i),
            TokenKind::Float(x) => Operand::Float(x),
            TokenKind::Keyword(Keyword::True) => Operand::Bool(true),
            TokenKind::Keyword(Keyword::False) => Operand::Bool(false),
            TokenKind::Minus => match self.next().map(|n| n.kind) {
                Some(TokenKind::Int(i)) => Operand::Int(-i),
                Some(TokenKind::Float(x)) => Operand::Float(-x),
                _ => return Err(self.error_at(t.start, "'-' must come before a number".into())),
            },
            other => {
                return Err(self.error_at(
                    t.start,
                    format!("expected a property or a constant, found {other}"),
                ))
            }
        })
    }

    fn check_numeric(&self, o: &Operand, start: usize) -> Result<(), SqlError> {
        match o {
            Operand::Str(s) => Err(self.error_at(
                start,
                format!("'{s}' cannot be compared with <, <=, >, >= or BETWEEN: numbers only"),
            )),
            Operand::Bool(b) => Err(self.error_at(
                start,
                format!(
                    "{} cannot be compared with <, <=, >, >= or BETWEEN: numbers only",
                    if *b { "TRUE" } else { "FALSE" }
                ),
            )),
            _ => Ok(()),
        }
    }

    fn property_of(&self, o: Operand, start: usize, what: &str) -> Result<String, SqlError> {
        match o {
            Operand::Property(name) => Ok(name),
            _ => Err(self.error_at(start, format!("{what} applies to a property"))),
        }
    }
}

/// `TRUE` or `FALSE` alone is an expression; anything else needs an operator.
fn standalone(o: Operand) -> Option<Expr> {
    match o {
        Operand::Bool(b) => Some(Expr::Const(b)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
