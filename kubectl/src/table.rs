//! Tables as kubectl prints them: upper-case headers, columns padded to their widest cell,
//! three spaces between, no trailing blanks.

/// `rows` under `headers`, one line each.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in rows {
        for (column, cell) in row.iter().enumerate() {
            if let Some(width) = widths.get_mut(column) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (column, cell) in cells.iter().enumerate() {
            if column > 0 {
                text.push_str("   ");
            }
            text.push_str(cell);
            if column + 1 < cells.len() {
                let pad = widths[column].saturating_sub(cell.chars().count());
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        text.trim_end().to_string()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let text = render(
            &["NAME", "STATE"],
            &[
                vec!["a-long-name".to_string(), "Verified".to_string()],
                vec!["b".to_string(), String::new()],
            ],
        );
        assert_eq!(
            text, "NAME          STATE\na-long-name   Verified\nb\n",
            "{text}"
        );
    }
}
