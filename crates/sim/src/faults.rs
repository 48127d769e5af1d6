//! The faults a run injects, by kind; a shrinking run turns them off one by one.

/// The faults a run injects; a shrinking run turns them off one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Faults {
    pub(crate) crash: bool,
    pub(crate) stall: bool,
    pub(crate) write_before: bool,
    pub(crate) write_after: bool,
    pub(crate) mid_batch: bool,
    pub(crate) commit_fail: bool,
    pub(crate) clock_jump: bool,
    pub(crate) agent_duplicate: bool,
    pub(crate) agent_late: bool,
    /// PostgreSQL only: a node's database connections are cut.
    pub(crate) connection_cut: bool,
}

impl Faults {
    pub(crate) const ALL: Faults = Faults {
        crash: true,
        stall: true,
        write_before: true,
        write_after: true,
        mid_batch: true,
        commit_fail: true,
        clock_jump: true,
        agent_duplicate: true,
        agent_late: true,
        connection_cut: true,
    };

    pub(crate) fn names(&self) -> Vec<&'static str> {
        let all = [
            (self.crash, "crash"),
            (self.stall, "stall"),
            (self.write_before, "write-before"),
            (self.write_after, "write-after"),
            (self.mid_batch, "mid-batch"),
            (self.commit_fail, "commit-fail"),
            (self.clock_jump, "clock-jump"),
            (self.agent_duplicate, "agent-duplicate"),
            (self.agent_late, "agent-late"),
            (self.connection_cut, "connection-cut"),
        ];
        all.into_iter().filter(|(on, _)| *on).map(|(_, n)| n).collect()
    }

    /// This set without fault `name`.
    pub(crate) fn without(mut self, name: &str) -> Faults {
        match name {
            "crash" => self.crash = false,
            "stall" => self.stall = false,
            "write-before" => self.write_before = false,
            "write-after" => self.write_after = false,
            "mid-batch" => self.mid_batch = false,
            "commit-fail" => self.commit_fail = false,
            "clock-jump" => self.clock_jump = false,
            "agent-duplicate" => self.agent_duplicate = false,
            "agent-late" => self.agent_late = false,
            "connection-cut" => self.connection_cut = false,
            _ => {}
        }
        self
    }
}
