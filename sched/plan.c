/* placeholder: the planner lands here */ typedef int sp_placeholder_plan;
