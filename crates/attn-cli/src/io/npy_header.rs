//! The header of a `.npy` file: a Python dict literal such as
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`, parsed by a small
//! recursive-descent reader that accepts exactly the strings, booleans and integer tuples NumPy
//! writes, and checks every number for overflow.

/// The three fields of a `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Element type code, such as `<f4`.
    pub descr: String,
    /// Whether the data is stored column-major.
    pub fortran_order: bool,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
}

enum Literal {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
}

/// Parses the header text; the error describes the first problem found.
pub fn parse_header(text: &str) -> Result<NpyHeader, String> {
    let mut p = Parser { s: text.as_bytes(), pos: 0 };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    p.expect(b'{')?;
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.skip_ws();
        p.expect(b':')?;
        let value = p.literal()?;
        match key.as_str() {
            "descr" => fill(&mut descr, &key, value.into_str(), "a string")?,
            "fortran_order" => fill(&mut fortran, &key, value.into_bool(), "True or False")?,
            "shape" => fill(&mut shape, &key, value.into_tuple(), "a tuple of integers")?,
            other => return Err(format!("unknown key '{other}', expected descr, fortran_order and shape")),
        }
        p.skip_ws();
        if !p.eat(b',') {
            p.skip_ws();
            p.expect(b'}')?;
            break;
        }
    }
    p.skip_ws();
    if p.pos != p.s.len() {
        return Err(format!("unexpected text after the dict at byte {}", p.pos));
    }
    let missing = |k: &str| format!("key '{k}' missing");
    Ok(NpyHeader {
        descr: descr.ok_or_else(|| missing("descr"))?,
        fortran_order: fortran.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
}

/// Stores `value` (`None` when the literal had the wrong kind) in the empty `slot`.
fn fill<T>(slot: &mut Option<T>, key: &str, value: Option<T>, want: &str) -> Result<(), String> {
    let value = value.ok_or_else(|| format!("key '{key}' must be {want}"))?;
    if slot.replace(value).is_some() {
        return Err(format!("key '{key}' given twice"));
    }
    Ok(())
}

impl Literal {
    fn into_str(self) -> Option<String> {
        match self {
            Literal::Str(s) => Some(s),
            _ => None,
        }
    }
    fn into_bool(self) -> Option<bool> {
        match self {
            Literal::Bool(b) => Some(b),
            _ => None,
        }
    }
    fn into_tuple(self) -> Option<Vec<usize>> {
        match self {
            Literal::Tuple(t) => Some(t),
            _ => None,
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}, found {}", c as char, self.pos, self.found()))
        }
    }

    fn found(&self) -> String {
        self.peek().map_or("the end".into(), |c| format!("{:?}", c as char))
    }

    fn string(&mut self) -> Result<String, String> {
        let quote = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("expected a quoted string at byte {}, found {}", self.pos, self.found())),
        };
        let start = self.pos + 1;
        let len = self.s[start..]
            .iter()
            .position(|&c| c == quote || c == b'\\')
            .ok_or_else(|| format!("string starting at byte {} is not closed", self.pos))?;
        let end = start + len;
        if self.s[end] == b'\\' {
            return Err(format!("escape sequence at byte {end} is not supported"));
        }
        self.pos = end + 1;
        String::from_utf8(self.s[start..end].to_vec()).map_err(|_| format!("string at byte {start} is not UTF-8"))
    }

    fn literal(&mut self) -> Result<Literal, String> {
        self.skip_ws();
        match self.peek() {
            Some(b'\'' | b'"') => self.string().map(Literal::Str),
            Some(b'(') => self.tuple().map(Literal::Tuple),
            Some(b'[') => Err("structured dtypes (a list as descr) are not supported".into()),
            _ => {
                for (word, value) in [("True", true), ("False", false)] {
                    if self.s[self.pos..].starts_with(word.as_bytes()) {
                        self.pos += word.len();
                        return Ok(Literal::Bool(value));
                    }
                }
                Err(format!("expected a string, tuple, True or False at byte {}, found {}", self.pos, self.found()))
            }
        }
    }

    fn tuple(&mut self) -> Result<Vec<usize>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                return Ok(dims);
            }
            dims.push(self.integer()?);
            self.skip_ws();
            if !self.eat(b',') {
                self.expect(b')')?;
                return Ok(dims);
            }
        }
    }

    fn integer(&mut self) -> Result<usize, String> {
        let start = self.pos;
        let mut n: usize = 0;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            n = n
                .checked_mul(10)
                .and_then(|n| n.checked_add(usize::from(c - b'0')))
                .ok_or_else(|| format!("dimension at byte {start} does not fit in {} bits", usize::BITS))?;
            self.pos += 1;
        }
        if self.pos == start {
            return Err(format!("expected a non-negative integer at byte {start}, found {}", self.found()));
        }
        self.eat(b'L');
        Ok(n)
    }
}
