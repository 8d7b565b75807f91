//! What the kit found: one line per case as it finishes (`PASS`, `FAIL`
//! with why, `SKIP` with why), each with its specification sections and
//! the rule it checks; a closing `N passed, M failed, K skipped`; JUnit XML
//! for CI.

use std::time::Duration;

/// A case's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// It holds.
    Pass,
    /// It does not: what differed.
    Fail(String),
    /// Not run: why (a profile the server does not claim, say).
    Skip(String),
}

/// One case of the suite.
#[derive(Debug, Clone)]
pub struct Case {
    /// `group/name`, e.g. `journal/run-finished-twice`.
    pub name: String,
    /// The specification sections it checks, e.g. `§7.7`.
    pub spec: String,
    /// The rule id it checks, when one.
    pub rule: Option<String>,
    /// Its outcome.
    pub verdict: Verdict,
    /// How long it took.
    pub time: Duration,
}

impl Case {
    /// The line printed for it.
    pub fn line(&self) -> String {
        let about = match &self.rule {
            Some(rule) => format!("[{} {rule}]", self.spec),
            None => format!("[{}]", self.spec),
        };
        match &self.verdict {
            Verdict::Pass => format!("PASS {} {about}", self.name),
            Verdict::Fail(why) => format!("FAIL {} {about}: {why}", self.name),
            Verdict::Skip(why) => format!("SKIP {} {about}: {why}", self.name),
        }
    }
}

/// Every case so far, printed as it comes.
#[derive(Debug, Default)]
pub struct Report {
    cases: Vec<Case>,
    quiet: bool,
}

impl Report {
    /// A report printing every case, or (`quiet`) failures only.
    pub fn new(quiet: bool) -> Report {
        Report {
            cases: Vec::new(),
            quiet,
        }
    }

    /// Records a case and prints its line.
    pub fn record(&mut self, case: Case) {
        if !self.quiet || matches!(case.verdict, Verdict::Fail(_)) {
            println!("{}", case.line());
        }
        self.cases.push(case);
    }

    /// The cases recorded.
    #[cfg(test)]
    pub fn cases(&self) -> &[Case] {
        &self.cases
    }

    /// How many cases failed.
    pub fn failed(&self) -> usize {
        self.count(|v| matches!(v, Verdict::Fail(_)))
    }

    fn count(&self, f: impl Fn(&Verdict) -> bool) -> usize {
        self.cases.iter().filter(|c| f(&c.verdict)).count()
    }

    /// The closing line: `N passed, M failed, K skipped`.
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.count(|v| *v == Verdict::Pass),
            self.failed(),
            self.count(|v| matches!(v, Verdict::Skip(_)))
        )
    }

    /// The cases as JUnit XML: one suite per group.
    pub fn junit(&self, name: &str) -> anyhow::Result<String> {
        use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
        let mut report = quick_junit::Report::new(name);
        let mut groups: Vec<&str> = self
            .cases
            .iter()
            .map(|c| c.name.split('/').next().unwrap_or_default())
            .collect();
        groups.dedup();
        for group in groups {
            let mut suite = TestSuite::new(group);
            for case in self
                .cases
                .iter()
                .filter(|c| c.name.split('/').next() == Some(group))
            {
                let status = match &case.verdict {
                    Verdict::Pass => TestCaseStatus::success(),
                    Verdict::Fail(why) => {
                        let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                        s.set_message(why.as_str());
                        s
                    }
                    Verdict::Skip(why) => {
                        let mut s = TestCaseStatus::skipped();
                        s.set_message(why.as_str());
                        s
                    }
                };
                let mut test = TestCase::new(case.name.as_str(), status);
                test.set_classname(format!("{group} {}", case.spec));
                test.set_time(case.time);
                if let Some(rule) = &case.rule {
                    test.add_property(quick_junit::Property::new("rule", rule.as_str()));
                }
                suite.add_test_case(test);
            }
            report.add_test_suite(suite);
        }
        Ok(report.to_string()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_summary_and_junit_say_what_happened() {
        let mut r = Report::new(true);
        let case = |name: &str, verdict| Case {
            name: name.to_owned(),
            spec: "§7.7".to_owned(),
            rule: Some("interrupt.resolved.once".to_owned()),
            verdict,
            time: Duration::from_millis(3),
        };
        r.record(case("commands/a", Verdict::Pass));
        r.record(case("commands/b", Verdict::Fail("got 200".into())));
        r.record(case("streams/c", Verdict::Skip("no graph profile".into())));
        assert_eq!(r.summary(), "1 passed, 1 failed, 1 skipped");
        assert_eq!(
            r.cases()[1].line(),
            "FAIL commands/b [§7.7 interrupt.resolved.once]: got 200"
        );
        let xml = r.junit("narad conformance").unwrap();
        assert!(xml.contains("<testsuite name=\"commands\""), "{xml}");
        assert!(xml.contains("got 200"), "{xml}");
        assert!(xml.contains("<skipped"), "{xml}");
    }
}
