//! Who the caller is (`identity`): its sources read and hashed
//! ([`caller`]), and whose keys (the caller on its site, [`scope`]).

pub(crate) mod caller;
pub(crate) mod scope;
