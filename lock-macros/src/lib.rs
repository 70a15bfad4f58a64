//! The `#[distributed_lock]` attribute (being written).
use proc_macro::TokenStream;

/// Placeholder: returns the item unchanged.
#[proc_macro_attribute]
pub fn distributed_lock(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
