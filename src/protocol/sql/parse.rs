//! The lexer and parser of [`SqlFilter`](super::SqlFilter)'s expressions.

use super::*;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum TokenKind {
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
pub(super) enum Keyword {
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
pub(super) struct Token {
    pub(super) kind: TokenKind,
    /// Byte offset in the source.
    pub(super) start: usize,
}

fn column(source: &str, byte: usize) -> usize {
    source
        .get(..byte)
        .map_or(byte, |prefix| prefix.chars().count())
        + 1
}

pub(super) fn lex(source: &str) -> Result<Vec<Token>, SqlError> {
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
                        // The one integer whose negation fits (as RocketMQ's Long.MIN_VALUE).
                        Err(_)
                            if text == "9223372036854775808"
                                && tokens
                                    .last()
                                    .is_some_and(|t: &Token| t.kind == TokenKind::Minus) =>
                        {
                            let minus = tokens.pop().map_or(start, |t| t.start);
                            tokens.push(Token {
                                kind: TokenKind::Int(i64::MIN),
                                start: minus,
                            });
                            continue;
                        }
                        // Past 64 bits, a decimal (as RocketMQ's, which reads it as one).
                        Err(_) => match text.parse::<f64>() {
                            Ok(x) if x.is_finite() => TokenKind::Float(x),
                            _ => return Err(error(start, format!("bad number {text}"))),
                        },
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
                let hint = match ch {
                    '!' => " (not equal is <>)",
                    '"' => " (strings take single quotes)",
                    _ => "",
                };
                return Err(error(start, format!("unexpected character {ch:?}{hint}")));
            }
        };
        tokens.push(Token { kind, start });
    }
    Ok(tokens)
}

pub(super) struct Parser<'s> {
    pub(super) source: &'s str,
    pub(super) tokens: Vec<Token>,
    pub(super) at: usize,
    pub(super) depth: usize,
}

impl Parser<'_> {
    pub(super) fn error_at(&self, byte: usize, message: String) -> SqlError {
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

    pub(super) fn peek(&self) -> Option<&Token> {
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

    pub(super) fn expr(&mut self) -> Result<Expr, SqlError> {
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
                // As RocketMQ: constant bounds the wrong way round are refused in BETWEEN,
                // not a filter that matches nothing; NOT BETWEEN takes them (it matches
                // every number).
                let above = !negated
                    && match (&low, &high) {
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
                    match self.peek_kind() {
                        Some(TokenKind::Comma) => self.at += 1,
                        Some(TokenKind::RParen) => {
                            self.at += 1;
                            break;
                        }
                        _ => return Err(self.error_here("expected ',' or ')' in the IN list")),
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
                match self.peek_kind() {
                    Some(TokenKind::Str(pattern)) => {
                        let pattern = pattern.clone();
                        self.at += 1;
                        Ok(Expr::Text {
                            op,
                            property,
                            pattern,
                            negated,
                        })
                    }
                    _ => Err(self.error_here("expected a string")),
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
                Some(TokenKind::Int(i)) if i != i64::MIN => Operand::Int(-i),
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
