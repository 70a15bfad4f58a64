//! Key templates: `"order:{order_id}"`, `"user:{self.tenant.id}"`.
//!
//! A template is literal text with placeholders `{name}` or
//! `{name.field.sub}`, where `name` is a parameter of the function or
//! `self`; `{{` and `}}` stand for literal braces. This module only reads
//! the syntax; `valid.rs` checks the names against the signature.

use std::fmt;
use syn::{Ident, Index, Member};

/// A parsed key template.
pub(crate) struct Template {
    pub(crate) segments: Vec<Segment>,
}

/// A run of literal text, or one placeholder.
pub(crate) enum Segment {
    /// Literal text, with `{{` and `}}` already turned into single braces.
    Text(String),
    Value(Placeholder),
}

/// `{root.field.sub}`.
pub(crate) struct Placeholder {
    /// What stood between the braces, for error messages.
    pub(crate) text: String,
    pub(crate) root: Root,
    pub(crate) fields: Vec<Member>,
}

/// What a placeholder starts from.
pub(crate) enum Root {
    /// `{self}` or `{self.field}`.
    SelfValue,
    /// A parameter name.
    Name(Ident),
}

/// Why a template did not parse. The messages are complete sentences about
/// "the key"; `valid.rs` may add the parameters that exist.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TemplateError {
    /// `key = ""`.
    Empty,
    /// A `{` without its `}`; `before` is the text up to it.
    Unclosed { before: String },
    /// A `}` without its `{`.
    Unmatched { before: String },
    /// `{}`.
    EmptyPlaceholder,
    /// `{0}`.
    Positional { text: String },
    /// `{amount:?}`, `{amount:>8}`.
    FormatSpec { text: String },
    /// Anything else between braces that is not `name` or `name.field`.
    Malformed { text: String },
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateError::Empty => f.write_str(
                "the lock key is empty: name what the lock protects, like `key = \"order:{order_id}\"`",
            ),
            TemplateError::Unclosed { before } => write!(
                f,
                "unclosed `{{` in the lock key after {before:?}: end the placeholder with `}}`, or write `{{{{` for a literal `{{`"
            ),
            TemplateError::Unmatched { before } => write!(
                f,
                "unmatched `}}` in the lock key after {before:?}: write `}}}}` for a literal `}}`, or open a placeholder with `{{`"
            ),
            TemplateError::EmptyPlaceholder => f.write_str(
                "empty placeholder `{}` in the lock key: name a parameter, like `{order_id}`, or write `{{}}` for literal braces",
            ),
            TemplateError::Positional { text } => write!(
                f,
                "positional placeholder `{{{text}}}` in the lock key: name a parameter instead, like `{{order_id}}`"
            ),
            TemplateError::FormatSpec { text } => write!(
                f,
                "placeholder `{{{text}}}` in the lock key has a format spec: key values are formatted with `Display`; write `{{{root}}}`",
                root = text.split(':').next().unwrap_or_default().trim()
            ),
            TemplateError::Malformed { text } => write!(
                f,
                "`{{{text}}}` is not a placeholder: write `{{name}}` or `{{name.field}}`, where `name` is a parameter or `self`, or `{{{{`/`}}}}` for literal braces"
            ),
        }
    }
}

/// Parses a key template.
pub(crate) fn parse(text: &str) -> Result<Template, TemplateError> {
    if text.is_empty() {
        return Err(TemplateError::Empty);
    }
    let mut segments = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(['{', '}']) {
        let before = &text[..text.len() - rest.len() + at];
        literal.push_str(&rest[..at]);
        let brace = &rest[at..at + 1];
        let after = &rest[at + 1..];
        if after.starts_with(brace) {
            // `{{` or `}}`: one literal brace.
            literal.push_str(brace);
            rest = &after[1..];
            continue;
        }
        if brace == "}" {
            return Err(TemplateError::Unmatched {
                before: before.to_owned(),
            });
        }
        let Some(end) = after
            .find(['{', '}'])
            .filter(|&end| &after[end..end + 1] == "}")
        else {
            return Err(TemplateError::Unclosed {
                before: before.to_owned(),
            });
        };
        if !literal.is_empty() {
            segments.push(Segment::Text(std::mem::take(&mut literal)));
        }
        segments.push(Segment::Value(placeholder(&after[..end])?));
        rest = &after[end + 1..];
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        segments.push(Segment::Text(literal));
    }
    Ok(Template { segments })
}

/// Reads what stands between the braces of one placeholder.
fn placeholder(text: &str) -> Result<Placeholder, TemplateError> {
    let owned = || text.to_owned();
    if text.is_empty() {
        return Err(TemplateError::EmptyPlaceholder);
    }
    if text.contains(':') {
        return Err(TemplateError::FormatSpec { text: owned() });
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TemplateError::Positional { text: owned() });
    }
    let mut parts = text.split('.');
    let root = match parts.next() {
        Some("self") => Root::SelfValue,
        Some(name) => {
            Root::Name(identifier(name).ok_or_else(|| TemplateError::Malformed { text: owned() })?)
        }
        None => return Err(TemplateError::Malformed { text: owned() }),
    };
    let fields = parts
        .map(member)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| TemplateError::Malformed { text: owned() })?;
    Ok(Placeholder {
        text: owned(),
        root,
        fields,
    })
}

/// A Rust identifier (raw identifiers included), not a keyword.
fn identifier(text: &str) -> Option<Ident> {
    let plain = text.strip_prefix("r#").unwrap_or(text);
    let well_formed = plain
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && plain.chars().all(|c| c.is_alphanumeric() || c == '_');
    if !well_formed {
        return None;
    }
    syn::parse_str::<Ident>(text).ok()
}

/// A field name, or a tuple index like `0`.
fn member(text: &str) -> Option<Member> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        if text.len() > 1 && text.starts_with('0') {
            return None;
        }
        let index = text.parse().ok()?;
        return Some(Member::Unnamed(Index {
            index,
            span: proc_macro2::Span::call_site(),
        }));
    }
    identifier(text).map(Member::Named)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The template written back with `<...>` around each placeholder.
    fn shape(text: &str) -> Result<String, TemplateError> {
        let template = parse(text)?;
        let mut out = String::new();
        for segment in &template.segments {
            match segment {
                Segment::Text(text) => out.push_str(text),
                Segment::Value(p) => {
                    out.push('<');
                    match &p.root {
                        Root::SelfValue => out.push_str("self"),
                        Root::Name(ident) => out.push_str(&ident.to_string()),
                    }
                    for field in &p.fields {
                        out.push('.');
                        match field {
                            Member::Named(ident) => out.push_str(&ident.to_string()),
                            Member::Unnamed(index) => out.push_str(&index.index.to_string()),
                        }
                    }
                    out.push('>');
                }
            }
        }
        Ok(out)
    }

    #[test]
    fn literal_text_and_placeholders() {
        assert_eq!(shape("job").unwrap(), "job");
        assert_eq!(shape("order:{order_id}").unwrap(), "order:<order_id>");
        assert_eq!(shape("{a}{b}").unwrap(), "<a><b>");
        assert_eq!(
            shape("t:{self.tenant.id}:{pair.0}").unwrap(),
            "t:<self.tenant.id>:<pair.0>"
        );
        assert_eq!(shape("{r#type}").unwrap(), "<r#type>");
    }

    #[test]
    fn doubled_braces_are_literal() {
        assert_eq!(shape("{{x}}").unwrap(), "{x}");
        assert_eq!(shape("a{{{b}}}c").unwrap(), "a{<b>}c");
    }

    #[test]
    fn errors() {
        assert_eq!(parse("").err(), Some(TemplateError::Empty));
        assert_eq!(
            parse("order:{id").err(),
            Some(TemplateError::Unclosed {
                before: "order:".into()
            })
        );
        assert_eq!(
            parse("a{b{c}}").err(),
            Some(TemplateError::Unclosed { before: "a".into() })
        );
        assert_eq!(
            parse("order:id}").err(),
            Some(TemplateError::Unmatched {
                before: "order:id".into()
            })
        );
        assert_eq!(parse("x:{}").err(), Some(TemplateError::EmptyPlaceholder));
        assert_eq!(
            parse("{0}").err(),
            Some(TemplateError::Positional { text: "0".into() })
        );
        assert_eq!(
            parse("{id:?}").err(),
            Some(TemplateError::FormatSpec {
                text: "id:?".into()
            })
        );
        for bad in [
            "{ id }", "{a-b}", "{a.}", "{.a}", "{_}", "{type}", "{a.01}", "{9a}",
        ] {
            assert!(
                matches!(parse(bad).err(), Some(TemplateError::Malformed { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn messages_show_the_fix() {
        let message = parse("{id:?}").err().unwrap().to_string();
        assert!(message.contains("write `{id}`"), "{message}");
        let message = parse("a}").err().unwrap().to_string();
        assert!(message.contains("`}}`"), "{message}");
    }
}
