//! Position information used with attention: sinusoidal encodings added to embeddings
//! ([`sinusoidal`]), rotary embeddings applied to queries and keys ([`rope`]) and ALiBi's linear
//! biases added to scores ([`alibi`]).

pub mod alibi;
pub mod rope;
pub mod sinusoidal;
