"""Representative prompts for the emulator's fidelity tests: code edits (copy-heavy),
document summaries (medium copy) and open chat (near-zero copy)."""

from __future__ import annotations

_CODE_A = """def process(items, threshold):
    result = []
    for item in items:
        if item.value > threshold:
            result.append(item.name.upper())
    total = 0
    for item in items:
        total += item.value
    average = total / len(items) if items else 0
    logger.info("processed %d items, average %.2f", len(items), average)
    return {"names": result, "total": total, "average": average}


class Registry:
    def __init__(self, name):
        self.name = name
        self.entries = {}

    def register(self, key, value):
        if key in self.entries:
            raise KeyError(f"duplicate key {key}")
        self.entries[key] = value
        return value

    def lookup(self, key, default=None):
        return self.entries.get(key, default)

    def remove(self, key):
        value = self.entries.pop(key)
        logger.debug("removed %s from %s", key, self.name)
        return value
"""

_CODE_B = """async function fetchUsers(client, ids) {
  const users = [];
  for (const id of ids) {
    const response = await client.get(`/api/users/${id}`);
    if (response.status !== 200) {
      console.warn(`user ${id} not found`);
      continue;
    }
    const body = await response.json();
    users.push({ id: body.id, name: body.name, email: body.email });
  }
  return users;
}

function groupByDomain(users) {
  const groups = {};
  for (const user of users) {
    const domain = user.email.split("@")[1];
    if (!groups[domain]) {
      groups[domain] = [];
    }
    groups[domain].push(user);
  }
  return groups;
}

module.exports = { fetchUsers, groupByDomain };
"""

_CODE_C = """type Config struct {
	Host    string
	Port    int
	Timeout time.Duration
	Retries int
}

func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg := &Config{Host: "localhost", Port: 8080, Timeout: 5 * time.Second, Retries: 3}
	if err := yaml.Unmarshal(data, cfg); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	if cfg.Port <= 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("invalid port %d", cfg.Port)
	}
	return cfg, nil
}
"""

EDITS = [
    "Refactor the following Python code: use a list comprehension in process() and add type hints. "
    "Return the full code, unchanged otherwise.\n```python\n" + _CODE_A + "```",
    "Rewrite this JavaScript to use Promise.all for the requests; keep everything else unchanged and "
    "return the complete file.\n```javascript\n" + _CODE_B + "```",
    "Fix the bug in this Go code (the default timeout is wrong) and return the whole file.\n```go\n"
    + _CODE_C
    + "```",
]

_DOC_A = (
    "The city council met on Tuesday to discuss the proposed budget for the coming fiscal year. "
    "The budget includes a three percent increase in funding for public schools, a new program to "
    "repair roads in the northern districts, and a reduction in spending on administrative staff. "
    "Several residents spoke during the public comment period. Some praised the investment in "
    "schools, while others argued that the road repair program did not go far enough, pointing to "
    "potholes that have gone unrepaired for more than two years. The mayor said the council would "
    "consider an amendment to extend the road program to the eastern districts if additional revenue "
    "becomes available from the state. The council also heard a report from the parks department, "
    "which plans to open two new playgrounds and renovate the public swimming pool before next summer. "
    "A final vote on the budget is scheduled for the first week of next month, after a second public "
    "hearing. Council members noted that the city's reserve fund remains healthy, at roughly eight "
    "percent of annual spending, and that the credit rating agencies have kept the city's outlook "
    "stable. The finance director warned, however, that rising pension costs will put pressure on "
    "future budgets unless the council finds new sources of revenue or reduces other spending."
)

_DOC_B = (
    "Release notes, version 4.2. This release adds support for streaming uploads larger than two "
    "gigabytes, improves the performance of the search index by roughly forty percent on large "
    "collections, and fixes a crash that occurred when a user renamed a folder while a sync was in "
    "progress. The command line tool gains a new flag, --dry-run, which prints the changes a sync "
    "would make without applying them. The minimum supported version of the server is now 3.8; "
    "older servers will refuse connections from this client with a clear error message. Deprecated "
    "settings: the option cache_size_mb has been replaced by cache_size, which accepts units such as "
    "MB and GB. The old option still works but logs a warning and will be removed in version 5.0. "
    "Known issues: on some network file systems, file modification times are rounded to the nearest "
    "two seconds, which can cause unnecessary re-uploads; a workaround is described in the manual."
)

SUMMARIES = [
    "Summarize the following article in a few sentences, quoting the key figures.\n\n" + _DOC_A,
    "Extract the key points from these release notes as a bullet list.\n\n" + _DOC_B,
]

CHATS = [
    "What are some good strategies for staying focused while working from home?",
    "Explain the difference between a process and a thread to a beginner.",
    "Write a short poem about the sea at night.",
    "Why is the sky blue? Give an intuitive explanation.",
]
