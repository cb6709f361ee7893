//! What a chat template may build, bounded by the render's fuel.
//!
//! minijinja charges fuel for the strings its operators build, but three things a template can
//! do cheaply cost memory or time that no fuel pays for:
//! - `list + list` is lazy, and once 32 concatenations nest minijinja copies the whole list at
//!   once: a list doubled 40 times (`{% set ns.x = ns.x + ns.x %}`) asks for 2^33 items in one
//!   allocation and aborts the process.
//! - Lists may share their items, so `{% set ns.x = [ns.x, ns.x] %}` repeated 40 times is a
//!   value of a few hundred bytes that prints as terabytes: `~`, the string filters (`upper`,
//!   `join`, `pprint`, `format`, ...), `in` on a string and the comparisons all print or walk the
//!   whole value without any fuel.
//! - `sum(start=[])` over lists concatenates as `+` does.
//!
//! So before a template is compiled its source is rewritten (the parse is minijinja's own,
//! `minijinja::machinery::parse`; only the positions of its nodes are used):
//! `a + b` becomes `__mlx_add((a), (b))`, `a ~ b` becomes `__mlx_concat((a), (b))`, each operand of
//! a comparison or `in` becomes `__mlx_small((x))`, and every filter but those that never print or
//! compare their input (`length`, `tojson`, `map`, ...) is preceded by `|__mlx_small`. The edits
//! stay on their line, so error positions are unchanged. At render time `__mlx_add` pays for the
//! items of two lists before concatenating them (as minijinja pays for tuples: 32 bytes an item),
//! `__mlx_concat` prints its operands into a buffer that stops at what the fuel left pays for, and
//! `__mlx_small` counts (without storing) what printing a list or map would write, stopping at the
//! same bound, and pays for it. A template whose instrumented source would not parse (no real
//! template; the positions come from minijinja's own parser) is compiled as written.

use std::fmt::Write as _;

use minijinja::machinery::ast::{BinOpKind, CallArg, Expr, Stmt, UnaryOpKind};
use minijinja::machinery::Span;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

/// The longest text one render may produce: 32 MiB, about eight million tokens, eight times the
/// longest context of any model this project runs (rendered text is tokenized and fed to the
/// model, so more can only fail later, after more work).
pub const MAX_RENDERED_TEXT: usize = 32 << 20;
/// How deeply a printed or `tojson` value may nest (a namespace can contain itself).
pub const MAX_VALUE_DEPTH: usize = 128;

/// Filters that never print or compare their input as a whole (they count it, pass it on, walk
/// it item by item under minijinja's fuel, or are this crate's own bounded versions).
const UNGUARDED_FILTERS: &[&str] = &[
    "length",
    "count",
    "first",
    "last",
    "list",
    "items",
    "map",
    "select",
    "reject",
    "selectattr",
    "rejectattr",
    "batch",
    "slice",
    "reverse",
    "default",
    "d",
    "attr",
    "abs",
    "round",
    "bool",
    "tojson",
    "string",
    "trim",
    "sum",
    "__mlx_small",
];

/// The bytes one unit of fuel pays for (minijinja's own price for text it builds).
const BYTES_PER_FUEL: u64 = 64;
/// What minijinja charges for one item of a list it builds (`SLOT_COST`): 32 bytes.
const SLOT_BYTES: u64 = 32;

#[derive(Debug)]
struct Edit {
    at: usize,
    /// Bytes of the source replaced (0: an insertion).
    len: usize,
    text: &'static str,
    /// Orders edits at one position: closings (inner first) before openings (outer first).
    order: (u8, i64),
}

/// The source with the edits described in the module docs, or `None` when it does not parse
/// (compiling it as written then reports the error).
pub(crate) fn instrument(source: &str, syntax: minijinja::syntax::SyntaxConfig) -> Option<String> {
    let ast = minijinja::machinery::parse(source, "<template>", syntax.clone()).ok()?;
    let mut w = Walker {
        src: source,
        edits: Vec::new(),
    };
    w.stmt(&ast);
    if w.edits.is_empty() {
        return Some(source.to_string());
    }
    w.edits.sort_by_key(|e| (e.at, e.order));
    let mut out = String::with_capacity(source.len() + w.edits.len() * 16);
    let mut pos = 0;
    for e in &w.edits {
        if e.at < pos || e.at + e.len > source.len() || !source.is_char_boundary(e.at) {
            return None;
        }
        out.push_str(&source[pos..e.at]);
        out.push_str(e.text);
        pos = e.at + e.len;
    }
    out.push_str(&source[pos..]);
    // Positions that were not where they seemed would show here.
    minijinja::machinery::parse(&out, "<template>", syntax).ok()?;
    Some(out)
}

struct Walker<'s> {
    src: &'s str,
    edits: Vec<Edit>,
}

fn start(s: Span) -> usize {
    s.start_offset as usize
}

fn end(s: Span) -> usize {
    s.end_offset as usize
}

impl Walker<'_> {
    fn open(&mut self, at: usize, span_end: usize, text: &'static str) {
        // Outer (longer) openings first.
        self.edits.push(Edit {
            at,
            len: 0,
            text,
            order: (1, -(span_end as i64)),
        });
    }

    fn close(&mut self, at: usize, span_start: usize) {
        // Inner (later-starting) closings first.
        self.edits.push(Edit {
            at,
            len: 0,
            text: "))",
            order: (0, -(span_start as i64)),
        });
    }

    fn stmts(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Template(t) => self.stmts(&t.children),
            Stmt::EmitExpr(e) => self.expr(&e.expr),
            Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => {}
            Stmt::ForLoop(f) => {
                self.expr(&f.iter);
                if let Some(e) = &f.filter_expr {
                    self.expr(e);
                }
                self.stmts(&f.body);
                self.stmts(&f.else_body);
            }
            Stmt::IfCond(c) => {
                self.expr(&c.expr);
                self.stmts(&c.true_body);
                self.stmts(&c.false_body);
            }
            Stmt::WithBlock(w) => {
                for (_, e) in &w.assignments {
                    self.expr(e);
                }
                self.stmts(&w.body);
            }
            Stmt::Set(s) => self.expr(&s.expr),
            Stmt::SetBlock(s) => {
                if let Some(f) = &s.filter {
                    self.expr(f);
                }
                self.stmts(&s.body);
            }
            Stmt::AutoEscape(a) => {
                self.expr(&a.enabled);
                self.stmts(&a.body);
            }
            Stmt::FilterBlock(f) => {
                self.expr(&f.filter);
                self.stmts(&f.body);
            }
            Stmt::Macro(m) => {
                for d in &m.defaults {
                    self.expr(d);
                }
                self.stmts(&m.body);
            }
            Stmt::CallBlock(c) => {
                self.expr(&c.call.expr);
                self.args(&c.call.args);
                for d in &c.macro_decl.defaults {
                    self.expr(d);
                }
                self.stmts(&c.macro_decl.body);
            }
            Stmt::Do(d) => {
                self.expr(&d.call.expr);
                self.args(&d.call.args);
            }
        }
    }

    fn args(&mut self, args: &[CallArg]) {
        for a in args {
            match a {
                CallArg::Pos(e)
                | CallArg::Kwarg(_, e)
                | CallArg::PosSplat(e)
                | CallArg::KwargSplat(e) => self.expr(e),
            }
        }
    }

    /// The end of the last token of `e` (its own span may not cover its operands).
    fn extent_end(e: &Expr) -> usize {
        let mut m = end(e.span());
        let mut upd = |x: &Expr| m = m.max(Self::extent_end(x));
        match e {
            Expr::Var(_) | Expr::Const(_) => {}
            Expr::Slice(s) => {
                upd(&s.expr);
                for x in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                    upd(x);
                }
            }
            Expr::UnaryOp(u) => upd(&u.expr),
            Expr::BinOp(b) => {
                upd(&b.left);
                upd(&b.right);
            }
            Expr::Compare(c) => {
                upd(&c.expr);
                for o in &c.ops {
                    upd(&o.expr);
                }
            }
            Expr::IfExpr(i) => {
                upd(&i.test_expr);
                upd(&i.true_expr);
                if let Some(f) = &i.false_expr {
                    upd(f);
                }
            }
            Expr::Filter(f) => {
                if let Some(x) = &f.expr {
                    upd(x);
                }
            }
            Expr::Test(t) => upd(&t.expr),
            Expr::GetAttr(g) => upd(&g.expr),
            Expr::GetItem(g) => {
                upd(&g.expr);
                upd(&g.subscript_expr);
            }
            Expr::Call(c) => upd(&c.expr),
            Expr::List(l) => l.items.iter().for_each(upd),
            Expr::Tuple(t) => t.items.iter().for_each(upd),
            Expr::Map(m) => m.keys.iter().chain(&m.values).for_each(upd),
        }
        m
    }

    /// The source from byte `i` (empty past its end or inside a character).
    fn tail(&self, i: usize) -> &str {
        self.src.get(i..).unwrap_or_default()
    }

    /// The first byte at or after `i` that is neither whitespace nor `)`.
    fn skip_closing(&self, mut i: usize) -> usize {
        let b = self.src.as_bytes();
        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b')') {
            i += 1;
        }
        i
    }

    fn skip_space(&self, mut i: usize) -> usize {
        let b = self.src.as_bytes();
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    }

    /// `a + b` / `a ~ b`: the binary operator spans of minijinja start at the left operand's
    /// first token (its opening parentheses included) and end at the right operand's last.
    fn rewrite_binop(&mut self, span: Span, left: &Expr, op: char, name: &'static str) {
        let at = self.skip_closing(Self::extent_end(left));
        if !self.tail(at).starts_with(op) || at >= end(span) {
            return;
        }
        self.open(start(span), end(span), name);
        self.edits.push(Edit {
            at,
            len: 1,
            text: "), (",
            order: (2, 0),
        });
        self.close(end(span), start(span));
    }

    /// A comparison's span starts at the token before its left operand; each operand is
    /// wrapped in `__mlx_small((...))`.
    fn guard_compare(&mut self, span: Span, left: &Expr, negated_in: bool) {
        let b = self.src.as_bytes();
        let mut i = start(span);
        // Skip the token before the operand: a keyword, a tag or variable start, or one
        // punctuation character.
        if i < b.len() && (b[i].is_ascii_alphabetic() || b[i] == b'_') {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
        } else if self.tail(i).starts_with("{{") || self.tail(i).starts_with("{%") {
            i += 2;
            if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
                i += 1;
            }
        } else {
            i += 1;
        }
        if !self.src.is_char_boundary(i.min(self.src.len())) {
            return;
        }
        let left_start = self.skip_space(i);
        let left_end = Self::extent_end(left);
        if left_start > start(left.span()) || left_end > end(span) {
            return;
        }
        let op_at = self.skip_closing(left_end);
        let rest = self.tail(op_at);
        let op_len = if negated_in {
            match rest.strip_prefix("not") {
                Some(r) if r.starts_with(|c: char| c.is_ascii_whitespace()) => {
                    let after = self.skip_space(op_at + 3);
                    if !self.tail(after).starts_with("in") {
                        return;
                    }
                    after + 2 - op_at
                }
                _ => return,
            }
        } else {
            ["==", "!=", "<=", ">=", "<", ">", "in"]
                .iter()
                .find(|o| rest.starts_with(**o))
                .map_or(0, |o| o.len())
        };
        if op_len == 0 {
            return;
        }
        let right_start = self.skip_space(op_at + op_len);
        if right_start >= end(span) {
            return;
        }
        // The left operand's closing parentheses stay inside its wrap: close it right before
        // the operator.
        self.open(left_start, op_at, "__mlx_small((");
        self.close(op_at, left_start);
        self.open(right_start, end(span), "__mlx_small((");
        self.close(end(span), right_start);
    }

    fn guard_args(&mut self, args: &[CallArg]) {
        for a in args {
            if let CallArg::Pos(e) | CallArg::Kwarg(_, e) = a {
                self.guard_simple(e);
            }
        }
    }

    /// Wraps `e` in `__mlx_small((...))` when it is a variable or a lookup on one (`ns.x`,
    /// `m['k']`): the expressions whose positions start at their first token. Others (literals,
    /// calls, filters) are left as they are: their values are built, and paid for, where they
    /// are made.
    fn guard_simple(&mut self, e: &Expr) {
        let mut root = e;
        loop {
            match root {
                Expr::GetAttr(g) => root = &g.expr,
                Expr::GetItem(g) => root = &g.expr,
                _ => break,
            }
        }
        let Expr::Var(v) = root else {
            return;
        };
        let (from, to) = (start(e.span()), Self::extent_end(e));
        if start(root.span()) != from || !self.tail(from).starts_with(v.id) || to > self.src.len() {
            return;
        }
        self.open(from, to, "__mlx_small((");
        self.close(to, from);
    }

    fn expr(&mut self, e: &Expr) {
        match e {
            Expr::Var(_) | Expr::Const(_) => {}
            Expr::Slice(s) => {
                self.expr(&s.expr);
                for x in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                    self.expr(x);
                }
            }
            Expr::UnaryOp(u) => {
                if let (UnaryOpKind::Not, Expr::BinOp(b)) = (&u.op, &u.expr) {
                    if matches!(b.op, BinOpKind::In) && start(b.span()) == start(u.span()) {
                        // `a not in b`: one node pair over the same tokens.
                        self.guard_compare(b.span(), &b.left, true);
                        self.expr(&b.left);
                        self.expr(&b.right);
                        return;
                    }
                }
                self.expr(&u.expr)
            }
            Expr::BinOp(b) => {
                match b.op {
                    BinOpKind::Add => self.rewrite_binop(b.span(), &b.left, '+', "__mlx_add(("),
                    BinOpKind::Concat => {
                        self.rewrite_binop(b.span(), &b.left, '~', "__mlx_concat((")
                    }
                    BinOpKind::Eq
                    | BinOpKind::Ne
                    | BinOpKind::Lt
                    | BinOpKind::Lte
                    | BinOpKind::Gt
                    | BinOpKind::Gte
                    | BinOpKind::In => self.guard_compare(b.span(), &b.left, false),
                    _ => {}
                }
                self.expr(&b.left);
                self.expr(&b.right);
            }
            Expr::Compare(c) => {
                self.expr(&c.expr);
                for o in &c.ops {
                    self.expr(&o.expr);
                }
            }
            Expr::IfExpr(i) => {
                self.expr(&i.test_expr);
                self.expr(&i.true_expr);
                if let Some(f) = &i.false_expr {
                    self.expr(f);
                }
            }
            Expr::Filter(f) => {
                if !UNGUARDED_FILTERS.contains(&f.name) {
                    let at = start(f.span());
                    if self.tail(at).starts_with(f.name) {
                        self.edits.push(Edit {
                            at,
                            len: 0,
                            text: "__mlx_small|",
                            order: (3, 0),
                        });
                    }
                }
                if let Some(x) = &f.expr {
                    self.expr(x);
                }
                // A filter's string arguments (`join(x)`, `replace(a, x)`) are printed.
                if f.name != "__mlx_small" {
                    self.guard_args(&f.args);
                }
                self.args(&f.args);
            }
            Expr::Test(t) => {
                // `x is eq(y)`, `x is in(y)` compare: their operands pay as `==`'s do.
                self.guard_simple(&t.expr);
                self.guard_args(&t.args);
                self.expr(&t.expr);
                self.args(&t.args);
            }
            Expr::GetAttr(g) => self.expr(&g.expr),
            Expr::GetItem(g) => {
                self.expr(&g.expr);
                self.expr(&g.subscript_expr);
            }
            Expr::Call(c) => {
                self.expr(&c.expr);
                self.args(&c.args);
            }
            Expr::List(l) => l.items.iter().for_each(|x| self.expr(x)),
            Expr::Tuple(t) => t.items.iter().for_each(|x| self.expr(x)),
            Expr::Map(m) => {
                for (k, v) in m.keys.iter().zip(&m.values) {
                    self.expr(k);
                    self.expr(v);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// At render time

/// The most bytes printing may produce now: what the fuel left pays for, at most
/// [`MAX_RENDERED_TEXT`].
fn print_cap(state: &State) -> usize {
    match state.fuel_levels() {
        Some((_, left)) => usize::try_from(left.saturating_mul(BYTES_PER_FUEL))
            .map_or(MAX_RENDERED_TEXT, |n| n.min(MAX_RENDERED_TEXT)),
        None => MAX_RENDERED_TEXT,
    }
}

fn too_big(state: &State, what: &str) -> Error {
    if print_cap(state) < MAX_RENDERED_TEXT {
        return Error::from(ErrorKind::OutOfFuel);
    }
    Error::new(
        ErrorKind::InvalidOperation,
        format!("{what} is longer than {MAX_RENDERED_TEXT} bytes"),
    )
}

/// A `fmt::Write` that keeps at most `cap` bytes and fails past them, so that
/// printing a value stops there.
struct Capped<'a> {
    buf: &'a mut String,
    len: usize,
    cap: usize,
}

impl std::fmt::Write for Capped<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.len += s.len();
        if self.len > self.cap {
            return Err(std::fmt::Error);
        }
        self.buf.push_str(s);
        Ok(())
    }
}

fn is_container(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable | ValueKind::Plain
    )
}

/// About how many bytes minijinja writes printing `v` (a string its length plus quotes and
/// escapes, another scalar 32, 4 more per item), counted without recursion up to `cap`:
/// `Err` past `cap` bytes or [`MAX_VALUE_DEPTH`] levels (a value may contain itself, and
/// printing recurses once per level).
fn printed_size(v: &Value, cap: u64) -> Result<u64, &'static str> {
    let mut total = 0u64;
    let mut stack = vec![(v.clone(), 0usize)];
    while let Some((v, depth)) = stack.pop() {
        if depth > MAX_VALUE_DEPTH {
            return Err("nested too deeply");
        }
        match v.kind() {
            ValueKind::String => {
                let s = v.as_str().unwrap_or_default();
                let escaped = s
                    .bytes()
                    .filter(|b| *b < 0x20 || matches!(b, b'\\' | b'"' | b'\''))
                    .count();
                total = total.saturating_add(s.len() as u64 + 2 + 5 * escaped as u64);
            }
            ValueKind::Seq | ValueKind::Map | ValueKind::Iterable | ValueKind::Plain => {
                let Ok(items) = v.try_iter() else {
                    total = total.saturating_add(32);
                    continue;
                };
                let is_map = matches!(v.kind(), ValueKind::Map | ValueKind::Plain);
                for item in items {
                    total = total.saturating_add(4);
                    if total > cap {
                        return Err("too long");
                    }
                    if is_map {
                        if let Ok(x) = v.get_item(&item) {
                            stack.push((x, depth + 1));
                        }
                    }
                    stack.push((item, depth + 1));
                }
            }
            _ => total = total.saturating_add(32),
        }
        if total > cap {
            return Err("too long");
        }
    }
    Ok(total)
}

/// Checks that printing `v` is paid for and bounded, and pays.
fn pay_for_printing(state: &State, v: &Value, what: &str) -> Result<(), Error> {
    if !is_container(v) {
        return Ok(());
    }
    match printed_size(v, print_cap(state) as u64) {
        Ok(n) => state.consume_fuel(n / BYTES_PER_FUEL),
        Err("too long") => Err(too_big(state, what)),
        Err(why) => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{what}: a value {why} (more than {MAX_VALUE_DEPTH} levels; a value that contains itself?)"),
        )),
    }
}

/// `__mlx_small(v)`: `v`, after paying for what printing it would write (counted, not
/// built); an error when that passes what the fuel left pays for.
pub(crate) fn small(state: &State, v: Value) -> Result<Value, Error> {
    pay_for_printing(state, &v, "a value printed or compared")?;
    Ok(v)
}

/// `__mlx_concat(a, b)`: `a ~ b`, printed into a buffer that stops at what the fuel left pays
/// for.
pub(crate) fn concat(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
        let n = x.len() as u64 + y.len() as u64;
        if n > print_cap(state) as u64 {
            return Err(too_big(state, "a `~` result"));
        }
        state.consume_fuel(n / BYTES_PER_FUEL)?;
        let s = [x, y].concat();
        return Ok(if a.is_safe() && b.is_safe() {
            Value::from_safe_string(s)
        } else {
            Value::from(s)
        });
    }
    pay_for_printing(state, &a, "a `~` operand")?;
    pay_for_printing(state, &b, "a `~` operand")?;
    let mut s = String::new();
    let mut w = Capped {
        buf: &mut s,
        len: 0,
        cap: print_cap(state),
    };
    if write!(w, "{a}{b}").is_err() {
        return Err(too_big(state, "a `~` result"));
    }
    state.consume_fuel(s.len() as u64 / BYTES_PER_FUEL)?;
    Ok(Value::from(s))
}

fn seq_len(v: &Value) -> u64 {
    match v.kind() {
        ValueKind::Seq | ValueKind::Iterable => v.len().unwrap_or(0) as u64,
        _ => 0,
    }
}

/// `__mlx_add(a, b)`: `a + b`, after paying for the items of two lists as minijinja pays for
/// those of the lists it builds (its own `+` of lists pays nothing, and may copy them all).
pub(crate) fn add(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    let seqs = matches!(a.kind(), ValueKind::Seq | ValueKind::Iterable)
        && matches!(b.kind(), ValueKind::Seq | ValueKind::Iterable);
    if seqs {
        let items = seq_len(&a).saturating_add(seq_len(&b));
        state.consume_fuel(items.saturating_mul(SLOT_BYTES) / BYTES_PER_FUEL)?;
    } else if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
        // minijinja's `+` checks its fuel pays for the string before building it.
        let n = x.len() as u64 + y.len() as u64;
        if n > print_cap(state) as u64 {
            return Err(too_big(state, "a `+` result"));
        }
        state.consume_fuel(n / BYTES_PER_FUEL)?;
    }
    // minijinja's own `+` is only reachable from Rust through `sum(start=a)` over `[b]`,
    // which adds as the operator does except that it skips an undefined `b` and refuses a
    // non-number after a number with its own message: those keep the operator's error.
    let plain_number = |v: &Value| v.kind() == ValueKind::Number;
    if b.is_undefined() || (plain_number(&a) && !plain_number(&b) && b.kind() != ValueKind::Bool) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "tried to use + operator on unsupported types {} and {}",
                a.kind(),
                b.kind()
            ),
        ));
    }
    minijinja::filters::sum(
        state,
        Value::from(vec![b]),
        None,
        Some(a),
        Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
    )
}

/// The `sum` filter: pays as `__mlx_add` does for each list it concatenates (minijinja's
/// concatenates without paying), then sums.
pub(crate) fn sum(
    state: &State,
    values: Value,
    attribute: Option<String>,
    start: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let attribute = match attribute {
        Some(a) => Some(a),
        None => kwargs.get::<Option<String>>("attribute")?,
    };
    let start = match start {
        Some(s) => Some(s),
        None => kwargs.get::<Option<Value>>("start")?,
    };
    kwargs.assert_all_used()?;
    if let Some(s) = &start {
        if matches!(s.kind(), ValueKind::Seq | ValueKind::Iterable) {
            // Every step may copy what the sum holds so far.
            let mut held = seq_len(s);
            for item in values.try_iter()? {
                let item = match &attribute {
                    Some(a) => a
                        .split('.')
                        .fold(item, |v, k| v.get_attr(k).unwrap_or(Value::UNDEFINED)),
                    None => item,
                };
                held = held.saturating_add(seq_len(&item));
                state.consume_fuel(1 + held.saturating_mul(SLOT_BYTES) / BYTES_PER_FUEL)?;
            }
        }
    }
    minijinja::filters::sum(
        state,
        values,
        attribute.as_deref(),
        start,
        Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(s: &str) -> String {
        instrument(s, Default::default()).unwrap()
    }

    #[test]
    fn operators_and_filters_are_instrumented() {
        for (src, want) in [
            ("{{ a + b }}", "{{ __mlx_add((a ), ( b)) }}"),
            (
                "{{ (a) + (b|f) }}",
                "{{ __mlx_add(((a) ), ( (b|__mlx_small|f))) }}",
            ),
            (
                "{{ a + b + c }}",
                "{{ __mlx_add((__mlx_add((a ), ( b)) ), ( c)) }}",
            ),
            (
                "{{ 'x' ~ m.content ~ '\\n' }}",
                "{{ __mlx_concat((__mlx_concat(('x' ), ( m.content)) ), ( '\\n')) }}",
            ),
            (
                "{% if m.role == 'user' %}{% endif %}",
                "{% if __mlx_small((m.role ))== __mlx_small(('user')) %}{% endif %}",
            ),
            (
                "{% if (m|length) > 1 %}{% endif %}",
                "{% if __mlx_small(((m|length) ))> __mlx_small((1)) %}{% endif %}",
            ),
            (
                "{% if 'a' not in x %}{% endif %}",
                "{% if __mlx_small(('a' ))not in __mlx_small((x)) %}{% endif %}",
            ),
            (
                "{{ f(a == b) }}",
                "{{ f(__mlx_small((a ))== __mlx_small((b))) }}",
            ),
            ("{{ x|upper|length }}", "{{ x|__mlx_small|upper|length }}"),
            (
                "{{ (a + b)|join(', ') }}",
                "{{ (__mlx_add((a ), ( b)))|__mlx_small|join(', ') }}",
            ),
            (
                "{% set ns.x = ns.x + [1] %}",
                "{% set ns.x = __mlx_add((ns.x ), ( [1])) %}",
            ),
            (
                "{{ a|join(ns.x) }}",
                "{{ a|__mlx_small|join(__mlx_small((ns.x))) }}",
            ),
            (
                "{{ a is eq(m['k']) }}",
                "{{ __mlx_small((a)) is eq(__mlx_small((m['k']))) }}",
            ),
            (
                "{{ a|replace('x', y) }}",
                "{{ a|__mlx_small|replace('x', __mlx_small((y))) }}",
            ),
        ] {
            assert_eq!(inst(src), want, "{src}");
        }
    }
}
