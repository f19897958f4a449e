//! Everything `ringmq` prints: writing to stdout (`emit`, `emit_json`), text tables,
//! messages in full (text block or JSON object), the one-line forms of `consume`, bodies as
//! text or hex. Commands decide what to say; the shapes shared between them live here.

use std::fmt::Write as _;
use std::io::Write;

use serde_json::{json, Value};

use ringmq::client::Message;

use crate::datetime::format_ms;

/// Property names the record uses for tags and keys (shown on their own lines).
const PROP_TAGS: &str = "TAGS";
const PROP_KEYS: &str = "KEYS";

/// Writes `text` to stdout (a newline is added). A closed pipe (`ringmq ... | head`) ends
/// the program quietly.
pub(crate) fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|_| out.write_all(b"\n"))
        .and_then(|_| out.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("ringmq: writing to stdout: {e}");
        std::process::exit(1);
    }
}

pub(crate) fn emit_json(value: &Value) {
    emit(&serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into()));
}

pub(crate) fn message_text(m: &Message, hex: bool) -> String {
    let keys: Vec<&str> = m.keys().collect();
    let props = user_properties(m);
    let mut s = String::new();
    let _ = writeln!(s, "topic:       {}", m.topic());
    let _ = writeln!(s, "queue:       {}", m.queue_id());
    let _ = writeln!(s, "offset:      {}", m.queue_offset());
    let _ = writeln!(s, "msg id:      {}", m.msg_id().encode());
    let _ = writeln!(s, "tags:        {}", m.tags().unwrap_or("-"));
    let _ = writeln!(
        s,
        "keys:        {}",
        if keys.is_empty() {
            "-".to_owned()
        } else {
            keys.join(" ")
        }
    );
    let _ = writeln!(
        s,
        "properties:  {}",
        if props.is_empty() {
            "-".to_owned()
        } else {
            props
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        }
    );
    let _ = writeln!(
        s,
        "born:        {} ({} ms) from {}",
        format_ms(m.born_timestamp_ms()),
        m.born_timestamp_ms(),
        m.born_host()
    );
    let _ = writeln!(
        s,
        "stored:      {} ({} ms)",
        format_ms(m.store_timestamp_ms()),
        m.store_timestamp_ms()
    );
    let _ = writeln!(s, "body bytes:  {}", m.body().len());
    let _ = write!(s, "body:        {}", body_text(m.body(), hex, false));
    s
}

pub(crate) fn message_json(m: &Message, hex: bool) -> Value {
    let props: serde_json::Map<String, Value> = user_properties(m)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
        .collect();
    let mut v = json!({
        "topic": m.topic(),
        "queue": m.queue_id(),
        "offset": m.queue_offset(),
        "msg_id": m.msg_id().encode(),
        "tags": m.tags(),
        "keys": m.keys().collect::<Vec<_>>(),
        "properties": props,
        "born_timestamp_ms": m.born_timestamp_ms(),
        "store_timestamp_ms": m.store_timestamp_ms(),
        "born_host": m.born_host().to_string(),
        "reconsume_times": m.reconsume_times(),
    });
    put_body(&mut v, m.body(), hex);
    v
}

/// Adds a body to a message's JSON object: `body_hex`, or `body` as UTF-8 text (invalid
/// bytes replaced).
fn put_body(v: &mut Value, body: &[u8], hex: bool) {
    if hex {
        v["body_hex"] = Value::String(to_hex(body));
    } else {
        v["body"] = Value::String(String::from_utf8_lossy(body).into_owned());
    }
}

/// One line of `consume` without `--group`: `queue=Q offset=O tags=T body=B`, or the
/// message's JSON object.
pub(crate) fn pulled_line(m: &Message, json: bool, hex: bool) -> String {
    if json {
        return message_json(m, hex).to_string();
    }
    format!(
        "queue={} offset={} tags={} body={}",
        m.queue_id(),
        m.queue_offset(),
        m.tags().unwrap_or("-"),
        body_text(m.body(), hex, true)
    )
}

/// One line of `consume --group`: `MSG ...` for a processed message, or `START ...` when its
/// processing begins (`end_ns` None); with `json`, an object with the same fields.
pub(crate) fn processed_line(
    client_id: &str,
    m: &Message,
    start_ns: u64,
    end_ns: Option<u64>,
    json: bool,
    hex: bool,
) -> String {
    let key = m.keys().next().unwrap_or("-");
    if json {
        let mut v = json!({
            "event": if end_ns.is_some() { "msg" } else { "start" },
            "client": client_id,
            "topic": m.topic(),
            "queue": m.queue_id(),
            "offset": m.queue_offset(),
            "start_ns": start_ns,
            "key": key,
        });
        if let Some(end_ns) = end_ns {
            v["end_ns"] = json!(end_ns);
            put_body(&mut v, m.body(), hex);
        }
        return v.to_string();
    }
    match end_ns {
        Some(end_ns) => format!(
            "MSG client={client_id} queue={} offset={} start_ns={start_ns} end_ns={end_ns} \
             key={key} body={}",
            m.queue_id(),
            m.queue_offset(),
            body_text(m.body(), hex, true)
        ),
        None => format!(
            "START client={client_id} queue={} offset={} start_ns={start_ns} key={key}",
            m.queue_id(),
            m.queue_offset()
        ),
    }
}

/// The message's properties other than tags and keys (shown on their own).
fn user_properties(m: &Message) -> Vec<(&str, &str)> {
    m.properties()
        .iter()
        .filter(|(k, _)| *k != PROP_TAGS && *k != PROP_KEYS)
        .collect()
}

/// A body as text: hex, or UTF-8 with invalid bytes replaced; `one_line` escapes control
/// characters (newlines, tabs, ...) so that a message takes one line.
pub(crate) fn body_text(body: &[u8], hex: bool, one_line: bool) -> String {
    if hex {
        return to_hex(body);
    }
    let text = String::from_utf8_lossy(body);
    if !one_line {
        return text.into_owned();
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

pub(crate) fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The last row of a per-queue table of `columns` columns: `total` in the first, the total
/// in the last.
pub(crate) fn total_row(columns: usize, total: u64) -> Vec<String> {
    let mut row = vec![String::new(); columns.max(2)];
    row[0] = "total".to_owned();
    row[columns.max(2) - 1] = total.to_string();
    row
}

/// A committed offset, `-` when there is none.
pub(crate) fn opt_offset(o: Option<u64>) -> String {
    o.map_or_else(|| "-".to_owned(), |o| o.to_string())
}

/// A left-aligned text table with two spaces between columns (no trailing spaces).
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let _ = write!(s, "{cell:<w$}", w = widths.get(i).copied().unwrap_or(0));
        }
        s.trim_end().to_owned()
    };
    let mut out = line(&mut headers.iter().copied());
    for row in rows {
        out.push('\n');
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_stay_on_one_line() {
        assert_eq!(body_text(b"a\nb\tc\\", false, true), "a\\nb\\tc\\\\");
        assert_eq!(body_text(b"a\nb", false, false), "a\nb");
        assert_eq!(body_text(&[0xff, b'a'], false, true), "\u{fffd}a");
        assert_eq!(body_text(&[0x00, 0xab], true, true), "00ab");
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["QUEUE", "MAX"],
            &[
                vec!["0".into(), "12".into()],
                vec!["total".into(), String::new()],
            ],
        );
        assert_eq!(t, "QUEUE  MAX\n0      12\ntotal");
    }
}
