//! Topic mapping rules (pure): an MQTT topic filter (`+` matches one level,
//! `#` the remaining levels, as in MQTT 3.1.1 §4.7) names the Tributary
//! topic a matching PUBLISH goes to. Rules are tried in order; the first
//! match wins; a topic no rule matches is refused.

use tributary_proto::keys::TopicName;

/// Header holding the MQTT topic a record was published to.
pub const HEADER_MQTT_TOPIC: &str = "mqtt.topic";
/// Header holding an MQTT 5 content type. MQTT 5 user properties become
/// headers of their own name and value (as `x-trib-h-{name}` does on the
/// HTTP path).
pub const HEADER_CONTENT_TYPE: &str = "content-type";

/// A parsed MQTT topic filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicFilter {
    text: String,
    levels: Vec<Level>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Level {
    Exact(String),
    One,
    Rest,
}

impl TopicFilter {
    /// Parses `text`: levels separated by `/`; `+` must be a whole level;
    /// `#` a whole level and the last one.
    ///
    /// # Errors
    /// A message saying what is wrong.
    pub fn parse(text: &str) -> Result<TopicFilter, String> {
        if text.is_empty() {
            return Err("an empty topic filter".into());
        }
        if text.contains('\0') {
            return Err("a topic filter must not contain NUL".into());
        }
        let parts: Vec<&str> = text.split('/').collect();
        let mut levels = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let level = match *part {
                "+" => Level::One,
                "#" if i + 1 == parts.len() => Level::Rest,
                "#" => return Err(format!("{text:?}: '#' must be the last level")),
                p if p.contains('+') || p.contains('#') => {
                    return Err(format!(
                        "{text:?}: '+' and '#' must take a whole level, got {p:?}"
                    ));
                }
                p => Level::Exact(p.to_owned()),
            };
            levels.push(level);
        }
        Ok(TopicFilter {
            text: text.to_owned(),
            levels,
        })
    }

    /// The filter as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the MQTT topic name `topic` matches. A wildcard in the
    /// first level does not match a topic starting with `$` (§4.7.2).
    pub fn matches(&self, topic: &str) -> bool {
        if topic.starts_with('$') && !matches!(self.levels.first(), Some(Level::Exact(_))) {
            return false;
        }
        let mut parts = topic.split('/');
        for level in &self.levels {
            match level {
                Level::Rest => return true,
                Level::One => {
                    if parts.next().is_none() {
                        return false;
                    }
                }
                Level::Exact(want) => match parts.next() {
                    Some(got) if got == want => {}
                    _ => return false,
                },
            }
        }
        parts.next().is_none()
    }
}

/// One `[[mqtt.topics]]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingRule {
    /// The MQTT topic filter.
    pub filter: TopicFilter,
    /// The Tributary topic.
    pub topic: TopicName,
}

/// Checks an MQTT topic *name* of a PUBLISH: not empty, no wildcards, no
/// NUL (MQTT 3.1.1 §4.7.3).
///
/// # Errors
/// A message saying what is wrong.
pub fn check_topic_name(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() {
        Err("an empty topic name")
    } else if topic.contains(['+', '#']) {
        Err("a topic name must not contain '+' or '#'")
    } else if topic.contains('\0') {
        Err("a topic name must not contain NUL")
    } else {
        Ok(())
    }
}

/// The topic of the first rule matching `mqtt_topic`.
pub fn map_topic<'a>(rules: &'a [MappingRule], mqtt_topic: &str) -> Option<&'a TopicName> {
    rules
        .iter()
        .find(|r| r.filter.matches(mqtt_topic))
        .map(|r| &r.topic)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> TopicFilter {
        TopicFilter::parse(s).expect("filter")
    }

    #[test]
    fn wildcards_match_per_mqtt_rules() {
        assert!(f("a/+/c").matches("a/b/c"));
        assert!(!f("a/+/c").matches("a/b/d"));
        assert!(!f("a/+/c").matches("a/b/c/d"));
        assert!(f("a/+").matches("a/"));
        assert!(f("a/#").matches("a"));
        assert!(f("a/#").matches("a/b/c"));
        assert!(f("#").matches("x/y"));
        assert!(!f("#").matches("$SYS/x"));
        assert!(!f("+/x").matches("$SYS/x"));
        assert!(f("$SYS/#").matches("$SYS/x"));
        assert!(f("plain").matches("plain"));
        assert!(!f("plain").matches("plain/x"));
    }

    #[test]
    fn bad_filters_are_refused() {
        assert!(TopicFilter::parse("").is_err());
        assert!(TopicFilter::parse("a/#/b").is_err());
        assert!(TopicFilter::parse("a+/b").is_err());
        assert!(TopicFilter::parse("a/b#").is_err());
    }

    #[test]
    fn first_matching_rule_wins() {
        let rules = vec![
            MappingRule {
                filter: f("sensors/+/temp"),
                topic: TopicName::new("/plant1/temp").expect("t"),
            },
            MappingRule {
                filter: f("sensors/#"),
                topic: TopicName::new("/plant1/sensors").expect("t"),
            },
        ];
        assert_eq!(
            map_topic(&rules, "sensors/a/temp").map(|t| t.as_str()),
            Some("/plant1/temp")
        );
        assert_eq!(
            map_topic(&rules, "sensors/a/hum").map(|t| t.as_str()),
            Some("/plant1/sensors")
        );
        assert_eq!(map_topic(&rules, "other"), None);
        assert!(check_topic_name("a/+").is_err());
        assert!(check_topic_name("").is_err());
        assert!(check_topic_name("a/b").is_ok());
    }
}
