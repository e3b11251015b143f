//! Chat templates: ChatML (`<|im_start|>role\ncontent<|im_end|>\n`, SmolLM2's), recognised from
//! the template text a model ships, with the default system prompt it writes when the
//! conversation has none. Other templates are not rendered (no Jinja engine here).

/// A recognised chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The system message written first when the conversation does not start with one.
    pub default_system: Option<String>,
}

const START: &str = "<|im_start|>";
const END: &str = "<|im_end|>";

impl ChatTemplate {
    /// The template of a model's Jinja `chat_template`, if it is ChatML.
    pub fn parse(jinja: &str) -> Option<Self> {
        if !jinja.contains(START) || !jinja.contains(END) {
            return None;
        }
        let system_start = format!("{START}system\n");
        let default_system = jinja.find(&system_start).and_then(|at| {
            let rest = &jinja[at + system_start.len()..];
            rest.find(END).map(|end| rest[..end].to_string())
        });
        Some(Self { default_system })
    }

    /// The prompt text of `messages` (`(role, content)`), ending with the assistant's turn opened
    /// (transformers' `apply_chat_template(..., add_generation_prompt=True)`).
    pub fn render(&self, messages: &[(&str, &str)]) -> String {
        let mut out = String::new();
        if let Some(system) = &self.default_system {
            if messages.first().is_none_or(|(role, _)| *role != "system") {
                out.push_str(&format!("{START}system\n{system}{END}\n"));
            }
        }
        for (role, content) in messages {
            out.push_str(&format!("{START}{role}\n{content}{END}\n"));
        }
        out.push_str(&format!("{START}assistant\n"));
        out
    }
}
