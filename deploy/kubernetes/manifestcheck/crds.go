package manifestcheck

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Prometheus Operator's types, limited to the fields the deployment
// uses. They are decoded strictly like the typed objects, so a misspelt
// field (which the API server would prune without a word) fails; a real
// field not listed yet must be added here.

// RelabelConfig is monitoring.coreos.com/v1 RelabelConfig.
type RelabelConfig struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    string   `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// Endpoint is monitoring.coreos.com/v1 Endpoint.
type Endpoint struct {
	Port              string          `json:"port,omitempty"`
	Path              string          `json:"path,omitempty"`
	Scheme            string          `json:"scheme,omitempty"`
	Interval          string          `json:"interval,omitempty"`
	ScrapeTimeout     string          `json:"scrapeTimeout,omitempty"`
	HonorLabels       bool            `json:"honorLabels,omitempty"`
	Relabelings       []RelabelConfig `json:"relabelings,omitempty"`
	MetricRelabelings []RelabelConfig `json:"metricRelabelings,omitempty"`
}

// ServiceMonitor is monitoring.coreos.com/v1 ServiceMonitor.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		JobLabel    string     `json:"jobLabel,omitempty"`
		SampleLimit *uint64    `json:"sampleLimit,omitempty"`
		Endpoints   []Endpoint `json:"endpoints"`
	} `json:"spec"`
}

// Rule is one recording or alerting rule, as in a Prometheus rules file.
type Rule struct {
	Record        string            `json:"record,omitempty"`
	Alert         string            `json:"alert,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// RuleGroup is one group of a Prometheus rules file.
type RuleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Limit    *int   `json:"limit,omitempty"`
	Rules    []Rule `json:"rules"`
}

// RulesFile is a Prometheus rules file (deploy/prometheus/rules.yml).
type RulesFile struct {
	Groups []RuleGroup `json:"groups"`
}

// PrometheusRule is monitoring.coreos.com/v1 PrometheusRule.
type PrometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              RulesFile `json:"spec"`
}

// Matcher is monitoring.coreos.com/v1alpha1 Matcher.
type Matcher struct {
	Name      string `json:"name"`
	Value     string `json:"value,omitempty"`
	MatchType string `json:"matchType,omitempty"`
}

// AlertmanagerRoute is monitoring.coreos.com/v1alpha1 Route.
type AlertmanagerRoute struct {
	Receiver       string              `json:"receiver,omitempty"`
	GroupBy        []string            `json:"groupBy,omitempty"`
	GroupWait      string              `json:"groupWait,omitempty"`
	GroupInterval  string              `json:"groupInterval,omitempty"`
	RepeatInterval string              `json:"repeatInterval,omitempty"`
	Matchers       []Matcher           `json:"matchers,omitempty"`
	Continue       bool                `json:"continue,omitempty"`
	Routes         []AlertmanagerRoute `json:"routes,omitempty"`
}

// InhibitRule is monitoring.coreos.com/v1alpha1 InhibitRule.
type InhibitRule struct {
	SourceMatch []Matcher `json:"sourceMatch,omitempty"`
	TargetMatch []Matcher `json:"targetMatch,omitempty"`
	Equal       []string  `json:"equal,omitempty"`
}

// AlertmanagerConfig is monitoring.coreos.com/v1alpha1 AlertmanagerConfig.
// Receivers stay untyped: each holds whatever integrations a user names.
type AlertmanagerConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Route        *AlertmanagerRoute `json:"route,omitempty"`
		Receivers    []map[string]any   `json:"receivers,omitempty"`
		InhibitRules []InhibitRule      `json:"inhibitRules,omitempty"`
	} `json:"spec"`
}
