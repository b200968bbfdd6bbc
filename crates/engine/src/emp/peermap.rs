//! [`PeerMap`]: the send and receive sides' per-peer state, a vector
//! sorted by [`PeerId`]. An address vector is a handful of peers that
//! every round walks (timers, frames ready, acknowledgments owed): a walk
//! over a vector costs a few instructions, one over a B-tree or a hash
//! map a few dozen; lookups by id are binary searches, and peers join and
//! leave rarely.

use crate::emp::peer::PeerId;

#[derive(Debug)]
pub struct PeerMap<V> {
    entries: Vec<(PeerId, V)>,
}

impl<V> Default for PeerMap<V> {
    fn default() -> Self {
        PeerMap { entries: Vec::new() }
    }
}

impl<V> PeerMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    fn find(&self, id: PeerId) -> Result<usize, usize> {
        self.entries.binary_search_by_key(&id, |e| e.0)
    }

    /// Inserts or replaces `id`'s value; returns the replaced one.
    pub fn insert(&mut self, id: PeerId, v: V) -> Option<V> {
        match self.find(id) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, v)),
            Err(i) => {
                self.entries.insert(i, (id, v));
                None
            }
        }
    }

    pub fn remove(&mut self, id: &PeerId) -> Option<V> {
        self.find(*id).ok().map(|i| self.entries.remove(i).1)
    }

    pub fn get(&self, id: &PeerId) -> Option<&V> {
        self.find(*id).ok().map(|i| &self.entries[i].1)
    }

    pub fn get_mut(&mut self, id: &PeerId) -> Option<&mut V> {
        self.find(*id).ok().map(|i| &mut self.entries[i].1)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Ids in ascending order.
    pub fn keys(&self) -> impl Iterator<Item = &PeerId> + '_ {
        self.entries.iter().map(|e| &e.0)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.entries.iter().map(|e| &e.1)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.entries.iter_mut().map(|e| &mut e.1)
    }

    /// Entries in ascending order of id.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&PeerId, &mut V)> + '_ {
        self.entries.iter_mut().map(|e| (&e.0, &mut e.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_ids_sorted_and_finds_each() {
        let mut m = PeerMap::new();
        for id in [5, 1, 9, 3] {
            assert!(m.insert(PeerId(id), id * 10).is_none());
        }
        assert_eq!(m.insert(PeerId(3), 31), Some(30));
        assert_eq!(m.keys().map(|p| p.0).collect::<Vec<_>>(), [1, 3, 5, 9]);
        assert_eq!(m.get(&PeerId(9)), Some(&90));
        assert_eq!(m.get(&PeerId(2)), None);
        *m.get_mut(&PeerId(1)).unwrap() += 1;
        assert_eq!(m.remove(&PeerId(5)), Some(50));
        assert_eq!(m.remove(&PeerId(5)), None);
        assert_eq!(m.values().copied().collect::<Vec<_>>(), [11, 31, 90]);
        assert_eq!(m.len(), 3);
        for (_, v) in m.iter_mut() {
            *v = 0;
        }
        assert!(m.values_mut().all(|v| *v == 0));
    }
}
