//! What a service wrapping another passes through unchanged.

/// The `ServiceWithDependents` methods a wrapper (`stopping::UntilExit`,
/// `upgrade`'s listener keeper) hands to its `inner` service as they are;
/// expanded inside the wrapper's impl.
macro_rules! delegate_to_inner {
    () => {
        fn name(&self) -> &str {
            self.inner.name()
        }

        fn threads(&self) -> Option<usize> {
            self.inner.threads()
        }

        fn listen_addresses(&self) -> Option<Vec<String>> {
            self.inner.listen_addresses()
        }
    };
}
pub(super) use delegate_to_inner;
