"""A job's result as the client reads it from the wire: the exclusions of bad peers."""

from gwtf.client import Excluded, format_result, job_result
from gwtf.v1 import job_pb2


def test_exclusions_travel_from_the_progress_to_the_result_json_and_text() -> None:
    progress = job_pb2.JobProgress(
        job_id="job-1", state=job_pb2.JOB_STATE_COMPLETED, iterations=3, iterations_completed=3,
        loss=[5.5, 5.2, 4.9],
        excluded=[job_pb2.Exclusion(node="a2", stage=1, iteration=0,
                                    reason="2 of the 3 replicas of stage 1 found its gradient "
                                    "out of bounds")],
    )
    result = job_result(job_pb2.JobProgress.FromString(progress.SerializeToString()))
    assert result.excluded == (
        Excluded("a2", 1, 0, "2 of the 3 replicas of stage 1 found its gradient out of bounds"),
    )
    assert result.to_json()["excluded"] == [
        {"node": "a2", "stage": 1, "iteration": 0,
         "reason": "2 of the 3 replicas of stage 1 found its gradient out of bounds"},
    ]
    text = format_result(result)
    assert "excluded        a2 (stage 1) at iteration 0: 2 of the 3 replicas" in text
    assert job_result(job_pb2.JobProgress()).to_json()["excluded"] == []
