//! `error_page: FILE`: the operator's HTML page for a refusal shown to a
//! browser, read when the file is (at start, by `check`, on a reload), so
//! a missing or unreadable page is a problem of the file, never a
//! surprise on the first refusal.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest page accepted: a refusal's page is small, and it is held
/// in memory for every refusal.
pub const MAX_ERROR_PAGE: usize = 64 * 1024;

/// The placeholders a page may hold, each replaced by its value
/// HTML-escaped: the status (`409`), the problem's `title`, `detail` and
/// `code`, and `back`, the link back (the same-origin `Referer`, else
/// `/`).
pub const PLACEHOLDERS: [&str; 5] = ["{status}", "{title}", "{detail}", "{code}", "{back}"];

/// `error_page`: a UTF-8 HTML file of at most [`MAX_ERROR_PAGE`] bytes
/// (a relative path is read from the configuration file's folder).
///
/// ```
/// use norepeat_gateway::config::Config;
///
/// // Read with the file: a missing page is a problem named by its field.
/// let problems = Config::parse("gateway.yaml", b"
/// upstream: http://127.0.0.1:9000
/// error_page: /nonexistent/refused.html
/// ").unwrap_err();
/// assert!(problems.to_string().contains("error_page: cannot read /nonexistent/refused.html"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPage {
    path: PathBuf,
    text: Arc<str>,
}

impl ErrorPage {
    /// Reads the page at `path`.
    ///
    /// # Errors
    /// A message naming the path: it cannot be read, is not UTF-8, is
    /// empty or is over [`MAX_ERROR_PAGE`] bytes.
    pub fn load(path: PathBuf) -> Result<Self, String> {
        let shown = path.display();
        let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        if bytes.len() > MAX_ERROR_PAGE {
            return Err(format!(
                "{shown} is {} bytes; an error page is at most {MAX_ERROR_PAGE}",
                bytes.len()
            ));
        }
        let text = String::from_utf8(bytes).map_err(|_| format!("{shown} is not UTF-8"))?;
        if text.trim().is_empty() {
            return Err(format!("{shown} is empty"));
        }
        Ok(Self {
            text: text.into(),
            path,
        })
    }

    /// Where the page was read from.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The page as read, its [`PLACEHOLDERS`] not yet filled.
    #[must_use]
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn temp(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("norepeat-error-page-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_page_is_read_with_the_file_from_its_folder() {
        let page = temp("refused.html", b"<h1>{title}</h1>");
        let file = page.with_file_name("gateway.yaml");
        let c = Config::parse(
            &file.display().to_string(),
            b"upstream: http://127.0.0.1:9000\nerror_page: refused.html\n",
        )
        .unwrap_or_else(|p| panic!("{p}"));
        let read = c.error_page.expect("a page");
        assert_eq!(read.text(), "<h1>{title}</h1>");
        assert_eq!(read.path(), page);
        assert!(
            Config::parse("g.yaml", b"upstream: http://127.0.0.1:9000\n")
                .unwrap()
                .error_page
                .is_none()
        );
    }

    #[test]
    fn a_page_that_cannot_serve_is_a_problem() {
        let empty = temp("empty.html", b"  \n");
        let big = temp("big.html", &vec![b'x'; MAX_ERROR_PAGE + 1]);
        let latin = temp("latin.html", b"caf\xe9");
        for (path, want) in [
            (PathBuf::from("/nonexistent/x.html"), "cannot read"),
            (empty, "is empty"),
            (big, "an error page is at most 65536"),
            (latin, "is not UTF-8"),
        ] {
            let err = ErrorPage::load(path.clone()).expect_err(want);
            assert!(
                err.contains(want) && err.contains(&path.display().to_string()),
                "{err}"
            );
        }
    }
}
