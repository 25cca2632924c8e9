//! Helpers for the adapters' model tests (races on [`crate::MemStore`]);
//! the client itself does not use them.

/// Runs `f(i)` for `i` in `0..n` on `n` threads released together (one
/// barrier), and returns the results in `i` order: for tests of what two
/// callers doing the same thing at the same moment get.
pub fn simultaneously<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let start = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let racers: Vec<_> = (0..n)
            .map(|i| {
                let (start, f) = (&start, &f);
                s.spawn(move || {
                    start.wait();
                    f(i)
                })
            })
            .collect();
        racers
            .into_iter()
            .map(|t| match t.join() {
                Ok(v) => v,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}
