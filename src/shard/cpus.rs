//! Where the shards run (`cpus`): an explicit list of CPUs, shard i on the i-th, or by
//! default shard i on CPU i when there are at least as many cores as shards, unpinned
//! otherwise.
//!
//! The list is for placing shards where their I/O completes: a disk whose completion
//! interrupts all land on one CPU (one hardware queue, as a virtio disk) wakes a shard on
//! another CPU with an inter-processor interrupt for every write, where a shard on that CPU
//! is interrupted in place (measured in perf/README, thirteenth session).

use glommio::Placement;

/// Most CPU ids a list may name (well past any machine this runs on).
const CPU_ID_MAX: usize = 4095;

/// Parses a CPU list (`"1"`, `"0-3,8"`; empty: none), in the order given, without
/// duplicates, every CPU one the process may run on (`allowed`).
pub(crate) fn parse_cpu_list(text: &str, allowed: &[usize]) -> Result<Vec<usize>, String> {
    let mut cpus: Vec<usize> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (parse_cpu(a, part)?, parse_cpu(b, part)?),
            None => {
                let cpu = parse_cpu(part, part)?;
                (cpu, cpu)
            }
        };
        if first > last {
            return Err(format!("cpus: the range {part} runs backwards"));
        }
        for cpu in first..=last {
            if cpus.contains(&cpu) {
                return Err(format!("cpus: CPU {cpu} is listed twice"));
            }
            if !allowed.contains(&cpu) {
                return Err(format!(
                    "cpus: CPU {cpu} is not one this process may run on ({})",
                    format_cpus(allowed)
                ));
            }
            cpus.push(cpu);
        }
    }
    Ok(cpus)
}

fn parse_cpu(text: &str, part: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(cpu) if cpu <= CPU_ID_MAX => Ok(cpu),
        _ => Err(format!(
            "cpus: {part:?} is not a CPU id or a range of them (for example 1 or 0-3,8)"
        )),
    }
}

fn format_cpus(cpus: &[usize]) -> String {
    let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
    format!("CPUs {}", list.join(","))
}

/// The CPUs this process may run on (its affinity mask), in order; `None` if the kernel
/// does not say.
pub(crate) fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it and
    // CPU_ISSET only reads it, both within its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let max = (CPU_ID_MAX + 1).min(libc::CPU_SETSIZE as usize);
        Some((0..max).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect())
    }
}

/// Each shard's placement: the listed CPUs in order (at least one per shard), else shard
/// i on CPU i when the cores suffice, else unpinned.
pub(crate) fn placements(
    cpus: &[usize],
    shards: usize,
    cores: usize,
) -> Result<Vec<Placement>, String> {
    if !cpus.is_empty() {
        if cpus.len() < shards {
            return Err(format!(
                "cpus lists {} CPU{} for {shards} shards: list one per shard",
                cpus.len(),
                if cpus.len() == 1 { "" } else { "s" }
            ));
        }
        return Ok(cpus[..shards]
            .iter()
            .map(|&c| Placement::Fixed(c))
            .collect());
    }
    Ok((0..shards)
        .map(|i| {
            if shards <= cores {
                Placement::Fixed(i)
            } else {
                Placement::Unbound
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges_parse_in_the_order_given() {
        let allowed: Vec<usize> = (0..16).collect();
        assert_eq!(parse_cpu_list("1", &allowed), Ok(vec![1]));
        assert_eq!(
            parse_cpu_list(" 3, 0-2 ,8", &allowed),
            Ok(vec![3, 0, 1, 2, 8])
        );
        assert_eq!(parse_cpu_list("", &allowed), Ok(vec![]));
    }

    #[test]
    fn bad_lists_are_refused_with_the_reason() {
        let allowed = vec![0, 1];
        for (text, reason) in [
            ("2", "not one this process may run on (CPUs 0,1)"),
            ("1,1", "listed twice"),
            ("0-1,1", "listed twice"),
            ("1-0", "runs backwards"),
            ("x", "not a CPU id"),
            ("1-", "not a CPU id"),
            ("99999", "not a CPU id"),
        ] {
            let e = parse_cpu_list(text, &allowed).unwrap_err();
            assert!(e.contains(reason), "{text}: {e}");
        }
    }

    #[test]
    fn placements_follow_the_list_else_the_core_count() {
        let fixed = |p: &Placement| match p {
            Placement::Fixed(c) => Some(*c),
            _ => None,
        };
        let listed = placements(&[1, 0], 2, 2).unwrap();
        assert_eq!(
            listed.iter().map(fixed).collect::<Vec<_>>(),
            [Some(1), Some(0)]
        );
        let one = placements(&[1, 0], 1, 2).unwrap();
        assert_eq!(one.iter().map(fixed).collect::<Vec<_>>(), [Some(1)]);
        let e = placements(&[1], 2, 2).unwrap_err();
        assert!(e.contains("1 CPU for 2 shards"), "{e}");
        let default = placements(&[], 2, 2).unwrap();
        assert_eq!(
            default.iter().map(fixed).collect::<Vec<_>>(),
            [Some(0), Some(1)]
        );
        let short = placements(&[], 3, 2).unwrap();
        assert_eq!(
            short.iter().map(fixed).collect::<Vec<_>>(),
            [None, None, None]
        );
    }
}
