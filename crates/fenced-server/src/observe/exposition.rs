//! A strict checker of the Prometheus text format (0.0.4), line by line:
//! what `/metrics` must always satisfy, whatever callers sent the node
//! (tests check every scrape with it; `promtool check metrics` agrees).
//!
//! Stricter than the format where fenced never needs its slack: only
//! `# HELP` and `# TYPE` comments, no empty lines, each family's TYPE
//! before its samples, its samples together, no series twice.

use std::collections::BTreeSet;

/// Checks a whole exposition; the error names the line and what is wrong.
pub fn check(text: &str) -> Result<(), String> {
    let body = text
        .strip_suffix('\n')
        .ok_or("the exposition does not end with a newline")?;
    let mut typed: Vec<(String, String)> = Vec::new();
    let mut families_seen = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut series = BTreeSet::new();
    for (i, line) in body.split('\n').enumerate() {
        let at = |what: String| format!("line {}: {what}: {line:?}", i + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            metric_name(name).map_err(at)?;
            escaped(help, false).map_err(at)?;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(|| at("no type".into()))?;
            metric_name(name).map_err(at)?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(at(format!("unknown type {kind:?}")));
            }
            if !families_seen.insert(name.to_string()) {
                return Err(at(format!("a second TYPE for {name}")));
            }
            typed.push((name.to_string(), kind.to_string()));
            current = Some(name.to_string());
        } else if line.starts_with('#') {
            return Err(at("a comment that is neither HELP nor TYPE".into()));
        } else {
            let (name, labels) = sample(line).map_err(at)?;
            let family = current
                .as_deref()
                .ok_or_else(|| at("a sample before any TYPE".into()))?;
            let kind = typed.last().map_or("", |(_, k)| k.as_str());
            let suffixed = ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name.strip_suffix(s) == Some(family));
            if name != family && !(suffixed && (kind == "histogram" || kind == "summary")) {
                return Err(at(format!("sample {name} outside its family {family}")));
            }
            if !series.insert((name.to_string(), labels)) {
                return Err(at("the same series twice".into()));
            }
        }
    }
    Ok(())
}

fn metric_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        return Err(format!("bad metric name {name:?}"));
    }
    Ok(())
}

fn label_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("bad label name {name:?}"));
    }
    Ok(())
}

/// Text with only the format's escapes: `\\` and `\n`, and `\"` inside a
/// label value (where an unescaped `"` may not appear).
fn escaped(text: &str, label: bool) -> Result<(), String> {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\\' | 'n') => {}
                Some('"') if label => {}
                other => return Err(format!("bad escape \\{other:?}")),
            },
            '"' if label => return Err("an unescaped quote".into()),
            '\n' => return Err("a raw newline".into()),
            _ => {}
        }
    }
    Ok(())
}

/// One sample line: its metric name and its labels as written.
fn sample(line: &str) -> Result<(&str, String), String> {
    let name_end = line.find(['{', ' ']).ok_or("a sample without a value")?;
    let name = &line[..name_end];
    metric_name(name)?;
    let mut rest = &line[name_end..];
    let mut labels = String::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut names = BTreeSet::new();
        let mut r = inner;
        loop {
            if let Some(after) = r.strip_prefix('}') {
                r = after;
                break;
            }
            let eq = r.find('=').ok_or("a label without =")?;
            let lname = &r[..eq];
            label_name(lname)?;
            if !names.insert(lname) {
                return Err(format!("label {lname} twice"));
            }
            r = r[eq + 1..]
                .strip_prefix('"')
                .ok_or("a label value not quoted")?;
            // The value ends at the first quote no backslash escapes.
            let mut end = None;
            let mut escape = false;
            for (i, c) in r.char_indices() {
                match c {
                    _ if escape => escape = false,
                    '\\' => escape = true,
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let end = end.ok_or("a label value never closed")?;
            escaped(&r[..end], true)?;
            r = &r[end + 1..];
            if let Some(after) = r.strip_prefix(',') {
                r = after;
            } else if !r.starts_with('}') {
                return Err("labels not separated by commas".into());
            }
        }
        labels = inner[..inner.len() - r.len()].to_string();
        rest = r;
    }
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let mut parts = rest.split(' ');
    let value = parts.next().unwrap_or("");
    let number = matches!(value, "+Inf" | "-Inf" | "NaN")
        || (value.parse::<f64>().is_ok()
            && value
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')));
    if !number {
        return Err(format!("value {value:?} is not a number"));
    }
    if let Some(ts) = parts.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("timestamp {ts:?} is not an integer"))?;
    }
    if parts.next().is_some() {
        return Err("text after the timestamp".into());
    }
    Ok((name, labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_exposition_passes() {
        let text = "# HELP a_total A count.\n# TYPE a_total counter\n\
                    a_total{x=\"1\",y=\"q\\\"\\\\\\n\"} 3\na_total 4\n\
                    # HELP h A histogram.\n# TYPE h histogram\n\
                    h_bucket{le=\"+Inf\"} 1\nh_sum 0.5\nh_count 1\n";
        assert_eq!(check(text), Ok(()));
    }

    #[test]
    fn what_broke_scrapes_is_refused() {
        let head = "# HELP m M.\n# TYPE m counter\n";
        for bad in [
            // The attack: a quote ends the label and a second one begins.
            "m{method=\"fenced.v1.x\",port=\"peer\",port=\"client\"} 1\n",
            "m{method=\"a\"b\"} 1\n",
            "m{method=\"a\\q\"} 1\n",
            "m{method=\"a\nb\"} 1\n",
            "m{method=\"a\"} one\n",
            "m{method=\"a\"}1\n",
            "m{method=\"a\"} 1\nm{method=\"a\"} 2\n",
            "n 1\n",
            "\nm 1\n",
            "# a remark\nm 1\n",
            "m 1",
        ] {
            assert!(check(&format!("{head}{bad}")).is_err(), "{bad:?} passed");
        }
    }
}
