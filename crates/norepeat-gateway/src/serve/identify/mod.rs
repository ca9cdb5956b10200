//! Who the caller is (`identity`): its sources read and hashed
//! ([`caller`]), the backend asked before the layers read it
//! ([`introspect`]), and whose keys (the caller on its site, [`scope`]).

pub(crate) mod caller;
pub(crate) mod introspect;
pub(crate) mod scope;
