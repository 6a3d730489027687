//! The routes an operator paused (SPEC §14), as this process last read them
//! from the store (every second, by [`super::RouteState`]). Checked on every
//! request that would be forwarded: a plain atomic load while no route is
//! paused, a read lock never held across an await otherwise.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

use crate::claim::Millis;

#[derive(Default)]
pub struct PausedRoutes {
    /// Whether any route is paused: the common answer without the lock.
    any: AtomicBool,
    /// Paused routes and since when.
    routes: RwLock<HashMap<String, Millis>>,
}

impl PausedRoutes {
    /// Whether `route` is paused.
    pub fn contains(&self, route: &str) -> bool {
        self.any.load(Ordering::Acquire) && self.since(route).is_some()
    }

    /// Since when `route` is paused, if it is.
    pub fn since(&self, route: &str) -> Option<Millis> {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        routes.get(route).copied()
    }

    /// What the store says now.
    pub fn replace(&self, paused: Vec<(String, Millis)>) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        *routes = paused.into_iter().collect();
        self.any.store(!routes.is_empty(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_paused_until_the_store_no_longer_says_so() {
        let p = PausedRoutes::default();
        assert!(!p.contains("a"));
        p.replace(vec![("a".into(), 5)]);
        assert!(p.contains("a") && !p.contains("b"));
        assert_eq!(p.since("a"), Some(5));
        p.replace(Vec::new());
        assert!(!p.contains("a"));
    }
}
