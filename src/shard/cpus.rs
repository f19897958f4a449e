//! Where the shards run (`cpus`): an explicit list of CPUs, shard i on the i-th; by
//! default one shard per CPU the process may use when there are enough of them (the CPUs
//! that take the data disk's completion interrupts first, when there are more CPUs than
//! shards), unpinned otherwise (more shards than cores, or a CPU quota smaller than the
//! affinity: `Broker::start` passes no CPUs then).
//!
//! Why the interrupts: a disk whose completions all land on one CPU (one hardware queue,
//! as a virtio disk) wakes a shard on another CPU with an inter-processor interrupt for
//! every write, where a shard on that CPU is interrupted in place (measured in perf/README,
//! thirteenth session). The disk is found for plain disks and partitions, device-mapper
//! and md devices (through the disks under them); on file systems without one block device
//! (btrfs, tmpfs, overlayfs) or interrupts named otherwise (NVMe native multipath) the
//! CPUs keep their order.

use std::path::Path;

use glommio::Placement;

/// Most CPU ids a list may name (the kernel's largest NR_CPUS).
const CPU_ID_MAX: usize = 8191;

/// The CPU ids of a list in the kernel's syntax (`"1"`, `"0-3,8"`; empty: none), in the
/// order given.
fn parse_ranges(text: &str) -> Result<Vec<usize>, String> {
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
        cpus.extend(first..=last);
    }
    Ok(cpus)
}

/// Parses a CPU list (`"1"`, `"0-3,8"`; empty: none), in the order given, without
/// duplicates, every CPU one the process may run on (`allowed`).
pub(crate) fn parse_cpu_list(text: &str, allowed: &[usize]) -> Result<Vec<usize>, String> {
    let cpus = parse_ranges(text)?;
    for (i, cpu) in cpus.iter().enumerate() {
        if cpus[..i].contains(cpu) {
            return Err(format!("cpus: CPU {cpu} is listed twice"));
        }
        if !allowed.contains(cpu) {
            return Err(format!(
                "cpus: CPU {cpu} is not one this process may run on ({})",
                format_cpus(allowed)
            ));
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

/// The CPUs this process may run on (its main thread's affinity, `Cpus_allowed_list` of
/// /proc/self/status: any number of CPUs), in order; `None` if that cannot be read.
pub(crate) fn allowed_cpus() -> Option<Vec<usize>> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    parse_ranges(list).ok().filter(|cpus| !cpus.is_empty())
}

/// Checks that an explicit list has one CPU per shard.
pub(crate) fn check_listed(cpus: &[usize], shards: usize) -> Result<(), String> {
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    if !cpus.is_empty() && cpus.len() != shards {
        return Err(format!(
            "cpus lists {} CPU{} for {shards} shard{}: list one per shard",
            cpus.len(),
            plural(cpus.len()),
            plural(shards)
        ));
    }
    Ok(())
}

/// Each shard's placement: the listed CPUs in order (`listed`, at least one per shard,
/// see [`check_listed`]); else, when there are at least as many `allowed` CPUs as shards,
/// one each: the CPUs with the most of the data disk's completion interrupts
/// (`disk_interrupts`, per CPU, asked only then) first, the others in order; else
/// unpinned.
pub(crate) fn placements(
    listed: &[usize],
    shards: usize,
    allowed: &[usize],
    disk_interrupts: impl FnOnce() -> Vec<(usize, u64)>,
) -> Vec<Placement> {
    if !listed.is_empty() {
        return listed
            .iter()
            .take(shards)
            .map(|&c| Placement::Fixed(c))
            .collect();
    }
    if shards > allowed.len() {
        return (0..shards).map(|_| Placement::Unbound).collect();
    }
    let mut order: Vec<usize> = allowed.to_vec();
    if shards < allowed.len() {
        let disk_interrupts = disk_interrupts();
        let taken = |cpu: usize| {
            disk_interrupts
                .iter()
                .find(|(c, _)| *c == cpu)
                .map_or(0, |(_, n)| *n)
        };
        // Stable: CPUs that took as many interrupts (none, for most) keep their order.
        order.sort_by_key(|&cpu| std::cmp::Reverse(taken(cpu)));
    }
    order
        .into_iter()
        .take(shards)
        .map(Placement::Fixed)
        .collect()
}

/// How many completion interrupts of the disk holding `dir` each CPU has taken, from
/// /proc/interrupts; empty when that cannot be told (not a block device, interrupts
/// named otherwise than virtio's `virtioN-req.Q`, NVMe's `nvmeNqQ` or the disk's name).
pub(crate) fn disk_interrupts(dir: &Path) -> Vec<(usize, u64)> {
    let Some(pattern) = disk_interrupt_name(dir) else {
        return Vec::new();
    };
    match std::fs::read_to_string("/proc/interrupts") {
        Ok(text) => parse_interrupts(&text, &pattern),
        Err(_) => Vec::new(),
    }
}

/// What the interrupts of the disk holding `dir` are named after.
fn disk_interrupt_name(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let mut block = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    // A partition's disk; a device-mapper or md device's first disk under it (a few levels
    // at most: LVM on LUKS on a partition).
    for _ in 0..8 {
        if block.join("partition").exists() {
            block = block.parent()?.to_owned();
        }
        let mut under: Vec<_> = match std::fs::read_dir(block.join("slaves")) {
            Ok(entries) => entries.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(_) => break,
        };
        under.sort();
        match under.first().and_then(|p| std::fs::canonicalize(p).ok()) {
            Some(next) => block = next,
            None => break,
        }
    }
    let disk = block.file_name()?.to_str()?.to_owned();
    let controller = std::fs::canonicalize(block.join("device")).ok();
    let controller = controller
        .as_deref()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap_or("");
    Some(if controller.starts_with("virtio") {
        format!("{controller}-req")
    } else if disk.starts_with("nvme") && controller.starts_with("nvme") {
        format!("{controller}q")
    } else {
        disk
    })
}

/// Sums, per CPU, the counts of /proc/interrupts lines whose description names `pattern`.
fn parse_interrupts(text: &str, pattern: &str) -> Vec<(usize, u64)> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let cpus: Vec<usize> = header
        .split_whitespace()
        .filter_map(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect();
    let mut sums = vec![0u64; cpus.len()];
    for line in lines {
        let mut fields = line.split_whitespace();
        // "NN:", a count per CPU, then the chip and the description.
        if fields.next().is_none() {
            continue;
        }
        let counts: Vec<u64> = fields
            .by_ref()
            .take(cpus.len())
            .map_while(|f| f.parse().ok())
            .collect();
        let named = fields.any(|f| f.starts_with(pattern));
        if named && counts.len() == cpus.len() {
            for (sum, n) in sums.iter_mut().zip(counts) {
                *sum = sum.saturating_add(n);
            }
        }
    }
    cpus.into_iter().zip(sums).collect()
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

    fn fixed(placements: &[Placement]) -> Vec<Option<usize>> {
        placements
            .iter()
            .map(|p| match p {
                Placement::Fixed(c) => Some(*c),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn placements_follow_the_list_else_the_disk_interrupts_else_the_cpu_order() {
        let allowed = [0, 1];
        let irqs = [(0, 5), (1, 9000)];
        // Listed: as listed, whatever the interrupts.
        assert_eq!(
            fixed(&placements(&[0, 1], 2, &allowed, || irqs.to_vec())),
            [Some(0), Some(1)]
        );
        assert_eq!(
            fixed(&placements(&[0, 1], 1, &allowed, || irqs.to_vec())),
            [Some(0)]
        );
        assert!(check_listed(&[1], 1).is_ok());
        let e = check_listed(&[1], 2).unwrap_err();
        assert!(e.contains("1 CPU for 2 shards"), "{e}");
        let e = check_listed(&[0, 1], 1).unwrap_err();
        assert!(e.contains("2 CPUs for 1 shard: list one per shard"), "{e}");
        // Fewer shards than CPUs: the one taking the disk's interrupts first.
        assert_eq!(
            fixed(&placements(&[], 1, &allowed, || irqs.to_vec())),
            [Some(1)]
        );
        assert_eq!(fixed(&placements(&[], 1, &allowed, Vec::new)), [Some(0)]);
        let four = [2, 3, 4, 5];
        let irqs4 = [(2, 0), (3, 0), (4, 70), (5, 0)];
        assert_eq!(
            fixed(&placements(&[], 2, &four, || irqs4.to_vec())),
            [Some(4), Some(2)]
        );
        // As many shards as CPUs: one each, in order (the CPUs the process may use).
        assert_eq!(
            fixed(&placements(&[], 2, &allowed, || irqs.to_vec())),
            [Some(0), Some(1)]
        );
        assert_eq!(
            fixed(&placements(&[], 4, &four, || irqs4.to_vec())),
            [Some(2), Some(3), Some(4), Some(5)]
        );
        // More shards than CPUs: unpinned.
        assert_eq!(
            fixed(&placements(&[], 3, &allowed, || irqs.to_vec())),
            [None, None, None]
        );
    }

    #[test]
    fn a_disks_interrupts_are_summed_per_cpu() {
        let text = "           CPU0       CPU1       \n\
             31:          0       6532 PCI-MSIX-0000:00:01.0   3-edge      virtio0-stats\n\
             35:          0          1 PCI-MSIX-0000:00:02.0   0-edge      virtio1-config\n\
             36:          7   28468326 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n\
             37:          3         10 PCI-MSIX-0000:00:02.0   2-edge      virtio1-req.1\n\
             38:          4          0 PCI-MSIX-0000:00:03.0   1-edge      virtio11-req.0\n\
            NMI:          0          0   Non-maskable interrupts\n\
            ERR:          0\n";
        assert_eq!(
            parse_interrupts(text, "virtio1-req"),
            [(0, 10), (1, 28468336)]
        );
        assert_eq!(parse_interrupts(text, "nvme0q"), [(0, 0), (1, 0)]);
        assert_eq!(parse_interrupts("", "virtio1-req"), []);
    }
}
