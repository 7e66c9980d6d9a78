//! The JSON of a safetensors header, parsed as Python's `json` module parses it (`NaN` and
//! `Infinity` are numbers, integers are exact whatever their size up to 4300 digits; but
//! a lone UTF-16 surrogate escape is refused, as the reference implementation does), with
//! nesting bounded before parsing and no key given twice in any object.

/// A parsed JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer, as its canonical decimal text (exact at any size).
    Int(String),
    /// A number with a fraction or exponent, `NaN` or `Infinity`.
    Float(f64),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object, its keys in the order given (each once).
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// The integer's value, where it fits an `i128`.
    pub fn int(&self) -> Option<i128> {
        match self {
            Json::Int(text) => text.parse().ok(),
            _ => None,
        }
    }
}

/// Why text could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not valid JSON: what Python's `json` would say.
    Invalid(String),
    /// A key given twice in one object.
    Duplicate(String),
}

/// The most digits an integer may have (Python's default limit on converting decimal
/// text to `int`).
const MAX_DIGITS: usize = 4300;

/// How deeply arrays and objects nest in JSON text `raw` (brackets inside strings do not
/// count), stopping once past `limit`; linear time, no allocation. Exact up to the point
/// where the text stops being valid JSON, which is as far as a parser would recurse.
pub fn nesting(raw: &[u8], limit: usize) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in raw {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > limit {
                    break;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Parse `text` (whose nesting the caller bounded with [`nesting`]) as one JSON value.
pub fn parse(text: &str) -> Result<Json, ParseError> {
    let mut p = Parser { text, at: 0 };
    p.space();
    let value = p.value()?;
    p.space();
    if p.at != text.len() {
        return Err(p.fail("Extra data", p.at));
    }
    Ok(value)
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn bytes(&self) -> &[u8] {
        self.text.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.at).copied()
    }

    /// Python's whitespace between tokens.
    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A message as Python's `json.JSONDecodeError` words it, at byte `at`.
    fn fail(&self, what: &str, at: usize) -> ParseError {
        let before = self.text.get(..at).unwrap_or(self.text);
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |n| n + 1);
        let column = before[line_start..].chars().count() + 1;
        let char_at = before.chars().count();
        ParseError::Invalid(format!(
            "{what}: line {line} column {column} (char {char_at})"
        ))
    }

    fn value(&mut self) -> Result<Json, ParseError> {
        let rest = &self.bytes()[self.at..];
        let literal = |p: &mut Self, word: &str, value: Json| {
            p.at += word.len();
            Ok(value)
        };
        match self.peek() {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Ok(Json::Str(self.string()?)),
            _ if rest.starts_with(b"null") => literal(self, "null", Json::Null),
            _ if rest.starts_with(b"true") => literal(self, "true", Json::Bool(true)),
            _ if rest.starts_with(b"false") => literal(self, "false", Json::Bool(false)),
            _ if rest.starts_with(b"NaN") => literal(self, "NaN", Json::Float(f64::NAN)),
            _ if rest.starts_with(b"Infinity") => {
                literal(self, "Infinity", Json::Float(f64::INFINITY))
            }
            _ if rest.starts_with(b"-Infinity") => {
                literal(self, "-Infinity", Json::Float(f64::NEG_INFINITY))
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.fail("Expecting value", self.at)),
        }
    }

    fn number(&mut self) -> Result<Json, ParseError> {
        let start = self.at;
        let digits = |p: &mut Self| {
            let from = p.at;
            while matches!(p.peek(), Some(b'0'..=b'9')) {
                p.at += 1;
            }
            p.at - from
        };
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        if self.peek() == Some(b'0') {
            self.at += 1;
        } else if digits(self) == 0 {
            return Err(self.fail("Expecting value", start));
        }
        let int_end = self.at;
        let mut float = false;
        if self.peek() == Some(b'.') && matches!(self.bytes().get(self.at + 1), Some(b'0'..=b'9')) {
            self.at += 1;
            digits(self);
            float = true;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let mark = self.at;
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if digits(self) == 0 {
                self.at = mark; // not an exponent: the number ends before it
            } else {
                float = true;
            }
        }
        let text = &self.text[start..self.at];
        if float {
            // Rust reads any length of digits; out of range is infinity, as in Python.
            return text
                .parse::<f64>()
                .map(Json::Float)
                .map_err(|_| self.fail("Expecting value", start));
        }
        let (negative, magnitude) = match text.strip_prefix('-') {
            Some(m) => (true, m),
            None => (false, text),
        };
        debug_assert_eq!(int_end, self.at);
        if magnitude.len() > MAX_DIGITS {
            return Err(ParseError::Invalid(format!(
                "Exceeds the limit ({MAX_DIGITS} digits) for integer string conversion: \
                 value has {} digits",
                magnitude.len()
            )));
        }
        let canonical = if negative && magnitude != "0" {
            format!("-{magnitude}")
        } else {
            magnitude.to_owned()
        };
        Ok(Json::Int(canonical))
    }

    fn string(&mut self) -> Result<String, ParseError> {
        let start = self.at;
        self.at += 1; // the opening quote
        let mut out = String::new();
        loop {
            let run = self.at;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.at += 1;
            }
            out.push_str(&self.text[run..self.at]);
            match self.peek() {
                None => return Err(self.fail("Unterminated string starting at", start)),
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => out.push(self.escape()?),
                Some(_) => return Err(self.fail("Invalid control character at", self.at)),
            }
        }
    }

    /// The character of the escape at the cursor (a backslash), the cursor moved past it.
    fn escape(&mut self) -> Result<char, ParseError> {
        let at = self.at;
        let c = match self.bytes().get(at + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let first = self.hex4(at + 2)?;
                self.at = at + 6;
                if (0xD800..0xDC00).contains(&first)
                    && self.bytes().get(self.at..self.at + 2) == Some(b"\\u")
                {
                    let second = self.hex4(self.at + 2)?;
                    if (0xDC00..0xE000).contains(&second) {
                        self.at += 6;
                        let c = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
                        return Ok(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
                    }
                }
                // A lone surrogate: Python's json keeps it, but it is no character (the
                // reference implementation refuses it, and a Rust string cannot hold it).
                return char::from_u32(first).ok_or_else(|| {
                    self.fail(&format!("Lone surrogate \\u{first:04x} in string"), at)
                });
            }
            None => return Err(self.fail("Unterminated string starting at", at)),
            Some(_) => return Err(self.fail("Invalid \\escape", at)),
        };
        self.at = at + 2;
        Ok(c)
    }

    fn hex4(&self, at: usize) -> Result<u32, ParseError> {
        self.bytes()
            .get(at..at + 4)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| self.fail("Invalid \\uXXXX escape", at - 1))
    }

    fn array(&mut self) -> Result<Json, ParseError> {
        self.at += 1;
        let mut items = Vec::new();
        self.space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Json::Arr(items));
        }
        loop {
            self.space();
            items.push(self.value()?);
            self.space();
            match self.peek() {
                Some(b']') => {
                    self.at += 1;
                    return Ok(Json::Arr(items));
                }
                Some(b',') => self.at += 1,
                _ => return Err(self.fail("Expecting ',' delimiter", self.at)),
            }
        }
    }

    fn object(&mut self) -> Result<Json, ParseError> {
        self.at += 1;
        let mut pairs: Vec<(String, Json)> = Vec::new();
        self.space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Json::Obj(pairs));
        }
        loop {
            self.space();
            if self.peek() != Some(b'"') {
                return Err(self.fail("Expecting property name enclosed in double quotes", self.at));
            }
            let key = self.string()?;
            self.space();
            if self.peek() != Some(b':') {
                return Err(self.fail("Expecting ':' delimiter", self.at));
            }
            self.at += 1;
            self.space();
            let value = self.value()?;
            pairs.push((key, value));
            self.space();
            match self.peek() {
                Some(b'}') => {
                    self.at += 1;
                    return unique(pairs);
                }
                Some(b',') => self.at += 1,
                _ => return Err(self.fail("Expecting ',' delimiter", self.at)),
            }
        }
    }
}

/// An object of `pairs`, or the first key given twice (in the order given).
fn unique(pairs: Vec<(String, Json)>) -> Result<Json, ParseError> {
    let mut seen = std::collections::HashSet::with_capacity(pairs.len());
    for (key, _) in &pairs {
        if !seen.insert(key.as_str()) {
            return Err(ParseError::Duplicate(key.clone()));
        }
    }
    Ok(Json::Obj(pairs))
}
