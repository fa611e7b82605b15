//! A role's rules as a classic BPF program, made short: the kernel checks
//! and compiles a filter when it is installed, at a cost that grows with
//! its length (here about 0.25 us an instruction beside a 25 us floor), and
//! the control filter is installed on a restore's path. seccompiler's
//! programs spend five instructions on each allowed syscall and five on
//! each value an argument may take, in one chain every syscall walks: the
//! control filter was 679 instructions, 0.33 ms to install. Here an allowed
//! syscall is one comparison, a set of values one comparison each after a
//! single load, and the numbers are split in halves until a leaf holds a
//! few syscalls, so a syscall walks a short path. What a program decides
//! is what seccompiler's program of the same rules decides (the tests run
//! both).

use std::collections::BTreeMap;

use seccompiler::{sock_filter, BpfProgram};

/// One condition on a syscall's argument: `(argument & mask) == value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ArgIs {
    /// Which argument (0 to 5).
    pub index: u8,
    /// Its low 32 bits only (what the kernel reads of an `int` argument),
    /// or all 64.
    pub width: Width,
    pub mask: u64,
    pub value: u64,
}

/// How much of an argument a condition compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Width {
    Low32,
    Full64,
}

impl ArgIs {
    /// The argument's low 32 bits equal `value`.
    pub(super) fn equal(index: u8, value: u64) -> Self {
        Self::masked(index, u64::from(u32::MAX), value)
    }

    /// The argument's low 32 bits, masked, equal `value`.
    pub(super) fn masked(index: u8, mask: u64, value: u64) -> Self {
        Self {
            index,
            width: Width::Low32,
            mask,
            value,
        }
    }
}

/// A syscall is allowed when any one of its rules holds, a rule when all
/// of its conditions do; a syscall with no rules is allowed whatever its
/// arguments.
pub(super) type Rules = BTreeMap<i64, Vec<Vec<ArgIs>>>;

/// Why rules did not make a program.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// A condition names an argument a syscall does not have (0 to 5).
    #[error("a rule of syscall {syscall} reads argument {index}; there are six")]
    ArgumentIndex {
        /// The syscall.
        syscall: i64,
        /// The argument named.
        index: u8,
    },
    /// A syscall's rules are longer than a conditional jump can pass over.
    #[error(
        "the rules of syscall {syscall} take {length} instructions; a jump passes at most 255"
    )]
    RulesTooLong {
        /// The syscall.
        syscall: i64,
        /// Its rules' instructions.
        length: usize,
    },
}

/// The most syscalls a leaf holds.
const LEAF_SYSCALLS: usize = 8;

pub(super) const LOAD_WORD: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const AND: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
pub(super) const JUMP_IF_EQUAL: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JUMP_IF_AT_LEAST: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JUMP: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
pub(super) const RETURN: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// `struct seccomp_data`: the syscall number, the architecture, the
/// instruction pointer, then the six arguments (little-endian halves).
pub(super) const NR: u32 = 0;
pub(super) const ARCH: u32 = 4;
const ARGS: u32 = 16;
pub(super) const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const TRAP: u32 = libc::SECCOMP_RET_TRAP;

/// The program that allows what `rules` allow on x86_64 and traps any
/// other syscall; another architecture's syscall kills the process (as
/// seccompiler's programs do).
pub(super) fn compile(rules: Rules) -> Result<BpfProgram, ProgramError> {
    for (syscall, rules) in &rules {
        if let Some(c) = rules.iter().flatten().find(|c| c.index > 5) {
            return Err(ProgramError::ArgumentIndex {
                syscall: *syscall,
                index: c.index,
            });
        }
    }
    let syscalls: Vec<_> = rules.into_iter().collect();
    let mut program = vec![
        step(LOAD_WORD, 0, 0, ARCH),
        step(JUMP_IF_EQUAL, 1, 0, AUDIT_ARCH_X86_64),
        step(RETURN, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        step(LOAD_WORD, 0, 0, NR),
    ];
    program.extend(node(&syscalls)?);
    Ok(program)
}

/// The subtree for `syscalls` (by number), with the number loaded: every
/// path through it compares the number before it loads anything else.
fn node(syscalls: &[(i64, Vec<Vec<ArgIs>>)]) -> Result<BpfProgram, ProgramError> {
    if syscalls.len() <= LEAF_SYSCALLS {
        return leaf(syscalls);
    }
    let (lower, upper) = syscalls.split_at(syscalls.len() / 2);
    // Syscall numbers are small and non-negative; the comparison is of the
    // number as loaded, unsigned.
    let pivot = upper[0].0 as u32;
    let (lower, upper) = (node(lower)?, node(upper)?);
    // At least the pivot: over the lower half with a jump of 32 bits
    // (a conditional one has 8); else into it.
    let mut program = vec![
        step(JUMP_IF_AT_LEAST, 0, 1, pivot),
        step(JUMP, 0, 0, lower.len() as u32),
    ];
    program.extend(lower);
    program.extend(upper);
    Ok(program)
}

/// A few syscalls: the ones allowed whatever their arguments first, each
/// one comparison to a shared return, then each one with rules, its rules
/// after its comparison; then the trap.
fn leaf(syscalls: &[(i64, Vec<Vec<ArgIs>>)]) -> Result<BpfProgram, ProgramError> {
    let (plain, ruled): (Vec<_>, Vec<_>) = syscalls.iter().partition(|(_, r)| r.is_empty());
    let mut program = Vec::new();
    let count = plain.len();
    for (i, (nr, _)) in plain.iter().enumerate() {
        // To the return after the last comparison and the jump past it.
        program.push(step(JUMP_IF_EQUAL, (count - i) as u8, 0, *nr as u32));
    }
    if count > 0 {
        program.push(step(JUMP, 0, 0, 1));
        program.push(step(RETURN, 0, 0, ALLOW));
    }
    for (nr, rules) in ruled {
        let block = rules_block(rules);
        let length = u8::try_from(block.len()).map_err(|_| ProgramError::RulesTooLong {
            syscall: *nr,
            length: block.len(),
        })?;
        program.push(step(JUMP_IF_EQUAL, 0, length, *nr as u32));
        program.extend(block);
    }
    program.push(step(RETURN, 0, 0, TRAP));
    Ok(program)
}

/// One syscall's rules, ending in a return on every path.
fn rules_block(rules: &[Vec<ArgIs>]) -> BpfProgram {
    // A set of values of one argument's low half: one load, one comparison
    // each (an ioctl's requests, a process id's few values).
    let first = rules[0].first().copied();
    let one_of = first.filter(|f| {
        f.width == Width::Low32
            && f.mask == u64::from(u32::MAX)
            && rules.iter().all(|r| {
                r.len() == 1
                    && r[0].index == f.index
                    && r[0].width == f.width
                    && r[0].mask == f.mask
            })
    });
    if let Some(f) = one_of.filter(|_| rules.len() < 250) {
        let mut block = vec![step(LOAD_WORD, 0, 0, low_half(f.index))];
        let count = rules.len();
        for (i, rule) in rules.iter().enumerate() {
            block.push(step(
                JUMP_IF_EQUAL,
                (count - i) as u8,
                0,
                rule[0].value as u32,
            ));
        }
        block.push(step(RETURN, 0, 0, TRAP));
        block.push(step(RETURN, 0, 0, ALLOW));
        return block;
    }
    let mut block = Vec::new();
    for rule in rules {
        let checks: Vec<_> = rule.iter().flat_map(|c| halves(*c)).collect();
        // Each check: a load, the mask when it keeps less than all, the
        // comparison; a failed comparison jumps to the next rule.
        let length: usize = checks
            .iter()
            .map(|&(_, mask, _)| 2 + usize::from(mask != u32::MAX))
            .sum();
        let mut left = length + 1;
        for (offset, mask, value) in checks {
            block.push(step(LOAD_WORD, 0, 0, offset));
            left -= 1;
            if mask != u32::MAX {
                block.push(step(AND, 0, 0, mask));
                left -= 1;
            }
            left -= 1;
            // At most 6 conditions of 2 halves of 3 instructions: fits.
            block.push(step(JUMP_IF_EQUAL, 0, left as u8, value));
        }
        block.push(step(RETURN, 0, 0, ALLOW));
    }
    block.push(step(RETURN, 0, 0, TRAP));
    block
}

/// What a condition compares, half by half: (offset, mask, value).
fn halves(c: ArgIs) -> Vec<(u32, u32, u32)> {
    let low = (low_half(c.index), c.mask as u32, c.value as u32);
    match c.width {
        Width::Low32 => vec![low],
        Width::Full64 => vec![
            (
                low_half(c.index) + 4,
                (c.mask >> 32) as u32,
                (c.value >> 32) as u32,
            ),
            low,
        ],
    }
}

fn low_half(index: u8) -> u32 {
    ARGS + 8 * u32::from(index)
}

pub(super) fn step(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };

    /// What a classic BPF program returns for `data` (`struct
    /// seccomp_data` as 32-bit words), for the instructions seccompiler
    /// and this module emit.
    pub(in crate::seccomp) fn run(program: &[sock_filter], data: &[u32; 16]) -> u32 {
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let i = &program[pc];
            let code = u32::from(i.code);
            pc += 1;
            // The instruction's class and operation (linux/bpf_common.h).
            match (code & 0x07, code & 0xf0) {
                (libc::BPF_LD, _) => a = data[i.k as usize / 4],
                (libc::BPF_ALU, libc::BPF_AND) => a &= i.k,
                (libc::BPF_RET, _) => return i.k,
                (libc::BPF_JMP, libc::BPF_JA) => pc += i.k as usize,
                (libc::BPF_JMP, op) => {
                    let taken = match op {
                        libc::BPF_JEQ => a == i.k,
                        libc::BPF_JGT => a > i.k,
                        libc::BPF_JGE => a >= i.k,
                        libc::BPF_JSET => a & i.k != 0,
                        _ => panic!("jump {op:#x}"),
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                other => panic!("instruction {other:?}"),
            }
        }
    }

    /// seccompiler's program of the same rules: the reference.
    pub(in crate::seccomp) fn chain(rules: &Rules) -> BpfProgram {
        let condition = |c: &ArgIs| {
            let (width, op) = match (c.width, c.mask == u64::from(u32::MAX)) {
                (Width::Low32, true) => (SeccompCmpArgLen::Dword, SeccompCmpOp::Eq),
                (Width::Low32, false) => (SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(c.mask)),
                (Width::Full64, _) => (SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(c.mask)),
            };
            SeccompCondition::new(c.index, width, op, c.value).unwrap()
        };
        let rules = rules
            .iter()
            .map(|(nr, rules)| {
                let rules = rules
                    .iter()
                    .map(|r| SeccompRule::new(r.iter().map(condition).collect()).unwrap())
                    .collect();
                (*nr, rules)
            })
            .collect();
        SeccompFilter::new(
            rules,
            SeccompAction::Trap,
            SeccompAction::Allow,
            TargetArch::x86_64,
        )
        .unwrap()
        .try_into()
        .unwrap()
    }

    /// Runs `a` and `b` over every syscall number below 512 and a few
    /// beyond, on x86_64 and i386, with each argument taking the values
    /// the rules name, one off them, with high bits set, and zero.
    pub(in crate::seccomp) fn assert_same(rules: &Rules, a: &[sock_filter], b: &[sock_filter]) {
        let mut values: Vec<u64> = vec![0, u64::MAX, 1 << 32];
        for c in rules.values().flatten().flatten() {
            values.extend([
                c.value,
                c.value ^ 1,
                c.value | (1 << 40),
                c.value & 0xffff_0000,
            ]);
        }
        values.sort_unstable();
        values.dedup();
        let (x86_64, i386) = (AUDIT_ARCH_X86_64, 0x4000_0003);
        for arch in [x86_64, i386] {
            for nr in (0..512).chain([0x4000_0000, 0x4000_0001, u32::MAX]) {
                let mut data = [0u32; 16];
                (data[0], data[1]) = (nr, arch);
                assert_eq!(run(a, &data), run(b, &data), "syscall {nr}, arch {arch:#x}");
                let Some(ruled) = rules.get(&i64::from(nr)).filter(|r| !r.is_empty()) else {
                    continue;
                };
                let indices: std::collections::BTreeSet<u8> =
                    ruled.iter().flatten().map(|c| c.index).collect();
                let indices: Vec<u8> = indices.into_iter().collect();
                // Every pair of values over the arguments the rules read.
                let combos = values.len().pow(indices.len().min(2) as u32);
                for combo in 0..combos {
                    let mut rest = combo;
                    for &index in indices.iter().take(2) {
                        let v = values[rest % values.len()];
                        rest /= values.len();
                        let at = (ARGS / 4 + 2 * u32::from(index)) as usize;
                        (data[at], data[at + 1]) = (v as u32, (v >> 32) as u32);
                    }
                    assert_eq!(run(a, &data), run(b, &data), "syscall {nr}, args {data:?}");
                }
            }
        }
    }

    #[test]
    fn a_program_decides_as_seccompilers_does() {
        let mut rules: Rules = [
            0i64, 1, 3, 9, 10, 11, 39, 60, 61, 62, 200, 231, 232, 300, 435,
        ]
        .iter()
        .map(|&nr| (nr, Vec::new()))
        .collect();
        rules.insert(
            16,
            (0..40).map(|v| vec![ArgIs::equal(1, 0xAE00 + v)]).collect(),
        );
        rules.insert(
            41,
            vec![
                vec![ArgIs::equal(0, 1), ArgIs::masked(1, 0xf, 1)],
                vec![ArgIs::equal(0, 1), ArgIs::masked(1, 0xf, 5)],
            ],
        );
        rules.insert(
            56,
            vec![vec![ArgIs {
                index: 0,
                width: Width::Full64,
                mask: 0x1_0001_0000,
                value: 0x1_0001_0000,
            }]],
        );
        rules.insert(62, vec![vec![ArgIs::equal(0, 7)], vec![ArgIs::equal(0, 9)]]);
        let short = compile(rules.clone()).unwrap();
        let reference = chain(&rules);
        assert!(
            short.len() * 2 < reference.len(),
            "{} {}",
            short.len(),
            reference.len()
        );
        assert_same(&rules, &short, &reference);
    }

    #[test]
    fn a_seventh_argument_is_refused() {
        let rules: Rules = [(16, vec![vec![ArgIs::equal(6, 1)]])].into();
        assert!(matches!(
            compile(rules),
            Err(ProgramError::ArgumentIndex {
                syscall: 16,
                index: 6
            })
        ));
    }

    #[test]
    fn rules_longer_than_a_jump_are_refused() {
        let rules: Rules = [(
            16,
            (0..100)
                .map(|v| vec![ArgIs::equal(1, v), ArgIs::equal(2, v)])
                .collect(),
        )]
        .into();
        assert!(matches!(
            compile(rules),
            Err(ProgramError::RulesTooLong { syscall: 16, .. })
        ));
    }
}
