//! This process as a lease holder (`client::lease`) names itself, what
//! such a name says about a holder of the same machine, and waiting out a
//! lease that such a holder is letting go or left behind when it ended.

use std::error::Error;
use std::time::{Duration, Instant};

/// This process as a lease holder names it: host and pid.
pub fn this_process() -> String {
    format!(
        "{} pid {}",
        std::fs::read_to_string("/etc/hostname")
            .unwrap_or_default()
            .trim(),
        std::process::id()
    )
}

/// Whether two holder names (see [`this_process`]) are of one machine.
pub fn same_machine(a: &str, b: &str) -> bool {
    // An empty host name (no /etc/hostname) says nothing.
    let host = |h: &str| {
        h.rsplit_once(" pid ")
            .map(|(host, _)| host.to_string())
            .filter(|host| !host.is_empty())
    };
    host(a).is_some_and(|x| Some(x) == host(b))
}

/// Whether `holder` names a process of this machine that has ended (no
/// such pid, or not a `lightstore` process any more).
pub fn ended_here(holder: &str) -> bool {
    let Some(pid) = holder
        .rsplit_once(" pid ")
        .and_then(|(_, pid)| pid.trim().parse::<u32>().ok())
    else {
        return false;
    };
    if !same_machine(holder, &this_process()) {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map_or(true, |comm| !comm.trim().starts_with("lightstore"))
}

/// Calls `claim` until it takes the lease or fails for another reason
/// than a live holder (`held` picks that reason out, with its words),
/// while `waitable` says the holder is letting go or has ended (or is
/// gone since the attempt: the lease may expire between the two), for
/// at most the lease's lifetime; says once, as `waiting`, why it waits.
pub fn claim_or_wait<T, E: Into<Box<dyn Error>>>(
    waiting: &str,
    mut claim: impl FnMut() -> Result<T, E>,
    held: impl Fn(&E) -> Option<String>,
    mut waitable: impl FnMut() -> Result<bool, Box<dyn Error>>,
) -> Result<T, Box<dyn Error>> {
    let deadline = Instant::now() + client::lease::TTL + Duration::from_secs(1);
    let mut told = false;
    loop {
        let e = match claim() {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        let Some(why) = held(&e) else {
            return Err(e.into());
        };
        if Instant::now() >= deadline || !waitable()? {
            return Err(e.into());
        }
        if !told {
            eprintln!("{waiting} ({why})");
            told = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_names_tell_machines_and_ended_processes() {
        let me = this_process();
        assert!(same_machine(&me, &me) || me.starts_with(" pid "));
        assert!(!same_machine("a pid 1", "b pid 1"));
        assert!(
            !same_machine(" pid 1", " pid 2"),
            "no host name says nothing"
        );
        assert!(!ended_here(&me), "this process runs");
        if let Some((host, _)) = me.rsplit_once(" pid ").filter(|(h, _)| !h.is_empty()) {
            // Pid 0 never names a user process.
            assert!(ended_here(&format!("{host} pid 0")));
        }
        assert!(!ended_here("elsewhere pid 0"));
    }
}
