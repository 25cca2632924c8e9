//! What a consistency check found wrong, for the adapters' checkers
//! (`fs check`, `volume check`): the problems in words, a bounded number
//! of them kept, and their exact count.

/// Most problems kept in words (the count is always exact).
pub const MAX_KEPT: usize = 100;

/// The problems a check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// The first [`MAX_KEPT`] problems, in words.
    pub problems: Vec<String>,
    /// How many problems there were.
    pub count: u64,
}

impl Findings {
    /// Records one problem.
    pub fn problem(&mut self, what: String) {
        self.count += 1;
        if self.problems.len() < MAX_KEPT {
            self.problems.push(what);
        }
    }

    /// Whether nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.count == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_problem_and_keeps_the_first() {
        let mut f = Findings::default();
        assert!(f.is_clean());
        for i in 0..MAX_KEPT + 5 {
            f.problem(format!("p{i}"));
        }
        assert!(!f.is_clean());
        assert_eq!(f.count, MAX_KEPT as u64 + 5);
        assert_eq!(f.problems.len(), MAX_KEPT);
        assert_eq!(f.problems[0], "p0");
    }
}
