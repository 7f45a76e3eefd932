//! Who holds each lease and waits for each resource: identities interned
//! as small numbers, so a lease carries four bytes (in its term's padding)
//! instead of a name, and counted, so the per-identity bounds are decided
//! by the table itself.

use std::collections::BTreeMap;

/// An identity of [`Identities`]; 0 is the empty identity (auth off, or a
/// command logged before leases had one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct IdentityId(u32);

impl IdentityId {
    pub const EMPTY: IdentityId = IdentityId(0);
}

/// What one identity has live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub leases: u64,
    pub waiters: u64,
}

/// The identities that hold a lease or wait, with what each has. A name
/// stays while it holds or waits for anything and is forgotten (its number
/// reused) once it holds nothing: the table remembers no more names than
/// leases and waiters. Numbers never leave the table: snapshots store
/// names, so two tables with the same leases write the same bytes however
/// their numbers fell.
#[derive(Debug, Clone)]
pub(crate) struct Identities {
    /// By number; a forgotten number's name is empty.
    names: Vec<String>,
    held: Vec<Held>,
    by_name: BTreeMap<String, IdentityId>,
    free: Vec<u32>,
}

impl Default for Identities {
    fn default() -> Self {
        Identities {
            names: vec![String::new()],
            held: vec![Held::default()],
            by_name: BTreeMap::new(),
            free: Vec::new(),
        }
    }
}

impl Identities {
    /// The number of `name`, if it holds or waits for anything (the empty
    /// identity always has one).
    pub fn lookup(&self, name: &str) -> Option<IdentityId> {
        if name.is_empty() {
            return Some(IdentityId::EMPTY);
        }
        self.by_name.get(name).copied()
    }

    /// The number of `name`, given one if it has none; `None` only when
    /// every `u32` is taken (more identities than a table holds leases).
    pub fn intern(&mut self, name: &str) -> Option<IdentityId> {
        if let Some(id) = self.lookup(name) {
            return Some(id);
        }
        let id = match self.free.pop() {
            Some(n) => {
                let i = usize::try_from(n).ok()?;
                *self.names.get_mut(i)? = name.to_string();
                n
            }
            None => {
                let n = u32::try_from(self.names.len()).ok()?;
                self.names.push(name.to_string());
                self.held.push(Held::default());
                n
            }
        };
        self.by_name.insert(name.to_string(), IdentityId(id));
        Some(IdentityId(id))
    }

    pub fn name(&self, id: IdentityId) -> &str {
        self.names.get(index(id)).map_or("", String::as_str)
    }

    pub fn held(&self, id: IdentityId) -> Held {
        self.held.get(index(id)).copied().unwrap_or_default()
    }

    /// What `name` has live (nothing if it has no number).
    pub fn held_by(&self, name: &str) -> Held {
        self.lookup(name)
            .map_or_else(Held::default, |id| self.held(id))
    }

    pub fn add_lease(&mut self, id: IdentityId) {
        self.change(id, |h| h.leases += 1);
    }

    pub fn end_lease(&mut self, id: IdentityId) {
        self.change(id, |h| h.leases = h.leases.saturating_sub(1));
    }

    pub fn add_waiter(&mut self, id: IdentityId) {
        self.change(id, |h| h.waiters += 1);
    }

    pub fn end_waiter(&mut self, id: IdentityId) {
        self.change(id, |h| h.waiters = h.waiters.saturating_sub(1));
    }

    /// Forgets every count (a load recounts them from the records).
    pub fn clear_counts(&mut self) {
        for h in &mut self.held {
            *h = Held::default();
        }
    }

    /// Forgets every name that holds nothing (after a load's recount).
    pub fn forget_unused(&mut self) {
        let unused: Vec<IdentityId> = self
            .by_name
            .values()
            .copied()
            .filter(|id| self.held(*id) == Held::default())
            .collect();
        for id in unused {
            self.forget(id);
        }
    }

    fn change(&mut self, id: IdentityId, f: impl FnOnce(&mut Held)) {
        let Some(h) = self.held.get_mut(index(id)) else {
            return;
        };
        f(h);
        if *h == Held::default() && id != IdentityId::EMPTY {
            self.forget(id);
        }
    }

    fn forget(&mut self, id: IdentityId) {
        let Some(name) = self.names.get_mut(index(id)) else {
            return;
        };
        self.by_name.remove(name.as_str());
        name.clear();
        self.free.push(id.0);
    }

    /// Checks the counts against `counted` (what the records hold), and
    /// that every number in use is its name's.
    pub fn check(&self, counted: &BTreeMap<IdentityId, Held>) -> Result<(), String> {
        for (i, h) in self.held.iter().enumerate() {
            let id = IdentityId(u32::try_from(i).map_err(|_| "too many identities")?);
            if counted.get(&id).copied().unwrap_or_default() != *h {
                return Err(format!(
                    "identity {:?}: its counts do not match the leases and waiters",
                    self.name(id)
                ));
            }
            if id != IdentityId::EMPTY
                && *h != Held::default()
                && self.by_name.get(self.name(id)) != Some(&id)
            {
                return Err(format!("identity {:?} is not indexed", self.name(id)));
            }
        }
        if self.by_name.len() + self.free.len() + 1 != self.names.len() {
            return Err("identity numbers do not add up".into());
        }
        Ok(())
    }
}

fn index(id: IdentityId) -> usize {
    usize::try_from(id.0).unwrap_or(usize::MAX)
}
