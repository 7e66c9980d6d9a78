//! Untrusted header values in messages, bounded and quoted as Python shows them
//! (`reprlib` with strings and other values cut to 80 characters, containers to two
//! levels), so that a message names a value the way the caller wrote it in Python.

use super::json::Json;

/// The most characters of a string or scalar shown.
const MAX_STRING: usize = 80;
/// The most digits of an integer shown.
const MAX_LONG: usize = 40;
/// The most items of an array, or pairs of an object, shown.
const MAX_ITEMS: [usize; 2] = [6, 4];
/// How many levels of containers are shown.
const MAX_LEVEL: usize = 2;
const FILL: &str = "...";

/// `value` as Python's bounded repr shows it.
pub fn short(value: &Json) -> String {
    shown(value, MAX_LEVEL)
}

/// String `s` as Python's bounded repr shows it.
pub fn short_str(s: &str) -> String {
    cut_str(s)
}

/// String `s` as Python's `repr` writes it, whole.
pub fn quoted(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            _ if c == quote => {
                out.push('\\');
                out.push(c);
            }
            _ if !printable(c) => {
                let n = c as u32;
                if n < 0x100 {
                    out.push_str(&format!("\\x{n:02x}"));
                } else if n < 0x10000 {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            _ => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Whether Python's `str.isprintable` holds for `c` (control, format, separator and
/// private-use characters are not printable; the space is), with the planes no version
/// of Unicode has assigned yet as unassigned (also not printable).
fn printable(c: char) -> bool {
    let n = c as u32;
    !(c.is_control()
        || matches!(
            n,
            0xA0 | 0xAD | 0x1680 | 0x180E | 0x202F | 0x205F | 0x3000 | 0xFEFF
        )
        || (0x2000..=0x200F).contains(&n)
        || (0x2028..=0x202E).contains(&n)
        || (0x2060..=0x206F).contains(&n)
        || (0xD800..=0xF8FF).contains(&n)
        || (0xFFF9..=0xFFFB).contains(&n)
        || (0x323B0..=0xDFFFF).contains(&n)
        || n >= 0xE0080
        || (0xE0000..=0xE007F).contains(&n))
}

fn shown(value: &Json, level: usize) -> String {
    match value {
        Json::Str(s) => cut_str(s),
        Json::Int(text) => cut(text, MAX_LONG),
        Json::Null => "None".to_owned(),
        Json::Bool(b) => (if *b { "True" } else { "False" }).to_owned(),
        Json::Float(f) => cut(&float(*f), MAX_STRING),
        Json::Arr(items) => {
            let inner = if level == 0 && !items.is_empty() {
                FILL.to_owned()
            } else {
                let mut pieces: Vec<String> = items
                    .iter()
                    .take(MAX_ITEMS[0])
                    .map(|item| shown(item, level.saturating_sub(1)))
                    .collect();
                if items.len() > MAX_ITEMS[0] {
                    pieces.push(FILL.to_owned());
                }
                pieces.join(", ")
            };
            format!("[{inner}]")
        }
        Json::Obj(pairs) => {
            if pairs.is_empty() {
                return "{}".to_owned();
            }
            if level == 0 {
                return format!("{{{FILL}}}");
            }
            let mut sorted: Vec<&(String, Json)> = pairs.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            let mut pieces: Vec<String> = sorted
                .iter()
                .take(MAX_ITEMS[1])
                .map(|(k, v)| format!("{}: {}", cut_str(k), shown(v, level - 1)))
                .collect();
            if pairs.len() > MAX_ITEMS[1] {
                pieces.push(FILL.to_owned());
            }
            format!("{{{}}}", pieces.join(", "))
        }
    }
}

/// A string's repr cut to [`MAX_STRING`] characters as `reprlib` cuts it.
fn cut_str(s: &str) -> String {
    let head: String = s.chars().take(MAX_STRING).collect();
    let whole = quoted(&head);
    if whole.chars().count() <= MAX_STRING {
        return whole;
    }
    let i = (MAX_STRING - FILL.len()) / 2;
    let j = MAX_STRING - FILL.len() - i;
    let n = s.chars().count();
    let ends: String = s
        .chars()
        .take(i)
        .chain(s.chars().skip(n.max(j) - j))
        .collect();
    let r: Vec<char> = quoted(&ends).chars().collect();
    let tail: String = r[r.len().saturating_sub(j)..].iter().collect();
    format!("{}{FILL}{tail}", r.iter().take(i).collect::<String>())
}

/// `text` cut to `max` characters, its middle left out.
fn cut(text: &str, max: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max {
        return text.to_owned();
    }
    let i = (max - FILL.len()) / 2;
    let j = max - FILL.len() - i;
    let head: String = chars[..i].iter().collect();
    let tail: String = chars[chars.len() - j..].iter().collect();
    format!("{head}{FILL}{tail}")
}

/// A float as Python's `repr` writes it: the shortest digits that read back, positional
/// for decimal exponents from -4 to 15, else `1.5e+16`.
pub fn float(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return (if f > 0.0 { "inf" } else { "-inf" }).to_owned();
    }
    let sci = format!("{f:e}"); // "-1.5e-7": the shortest digits that read back
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if (point as usize) >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{a}.{b}")
        };
        return format!("{sign}{body}");
    }
    let (first, rest) = digits.split_at(1);
    let frac = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let esign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
}
